-- Headless Neovim 0.11 end-to-end check of oom-lsp, configured the way
-- docs/editors.md tells users to (vim.lsp.config + vim.lsp.enable, no plugin).
--
--   OOM_PY=<python with oom-lsp> OOM_FILE=<scratch copy of a risky file> \
--   OOM_FIXTURES=<folder of training scripts> OOM_CLASSIFIER=<a float32 training script> \
--     nvim --headless --clean -l tests/e2e/neovim_e2e.lua
--
-- Exits 0 when every check passes; otherwise prints "FAIL: ..." on stderr and exits 1.

local python = assert(os.getenv("OOM_PY"), "OOM_PY is not set")
local file = assert(os.getenv("OOM_FILE"), "OOM_FILE is not set")
local timeout_ms = tonumber(os.getenv("OOM_TIMEOUT_MS") or "30000")
local fixtures = assert(os.getenv("OOM_FIXTURES"), "OOM_FIXTURES is not set")
local classifier = assert(os.getenv("OOM_CLASSIFIER"), "OOM_CLASSIFIER is not set")
-- An estimate runs the script on fake tensors in a subprocess: seconds, more on a busy machine.
local estimate_ms = tonumber(os.getenv("OOM_ESTIMATE_TIMEOUT_MS") or "240000")
local MESSAGE_LIMIT, HOVER_LINES = 120, 15

local function fail(message)
  io.stderr:write("FAIL: " .. message .. "\n")
  os.exit(1)
end

local function step(message)
  io.stdout:write("ok: " .. message .. "\n")
end

local function wait_for(what, predicate)
  if not vim.wait(timeout_ms, predicate, 50) then
    fail("timed out waiting for " .. what)
  end
end

-- AI fixes through tests/llm's loopback model (OOM_LLM_URL), on OOM_AI_FILE.
local llm_url, ai_file = os.getenv("OOM_LLM_URL"), os.getenv("OOM_AI_FILE")
local llm = llm_url and { enabled = true, baseUrl = llm_url, model = "test-model", timeout = 30 } or nil

vim.lsp.config("oom_lsp", {
  cmd = { python, "-m", "oom_lsp" },
  filetypes = { "python" },
  root_markers = { "pyproject.toml", ".git" },
  -- strict: the checkpoints of an unsized model are shown in strict mode only. gpu: the target
  -- of the lens's estimate, as docs/editors.md sets it.
  settings = { oomLsp = { severity = { OOM501 = "error" }, strict = true, gpu = "RTX 3090", llm = llm } },
})
vim.lsp.enable("oom_lsp")

-- The rest of docs/editors.md's configuration: inlay hints on, code lenses refreshed, a border
-- on floats, the progress in the status line.
vim.lsp.inlay_hint.enable(true)
vim.api.nvim_create_autocmd({ "LspAttach", "BufEnter", "InsertLeave", "BufWritePost" }, {
  pattern = "*.py",
  callback = function(args) vim.lsp.codelens.refresh({ bufnr = args.buf }) end,
})
vim.o.winborder = "rounded"
vim.o.statusline = "%f %h%m%r%=%{v:lua.vim.lsp.status()}  %l,%c %P"
vim.api.nvim_create_autocmd("LspProgress", { command = "redrawstatus" })
-- What the status line is given: the titles of the progress that began, and those that ended.
local progress = { begun = {}, ended = 0 }
vim.api.nvim_create_autocmd("LspProgress", {
  callback = function(ev)
    local value = ev.data.params.value
    if value.kind == "begin" then
      table.insert(progress.begun, value.title)
    elseif value.kind == "end" then
      progress.ended = progress.ended + 1
    end
  end,
})

vim.cmd.edit(file)
local buf = vim.api.nvim_get_current_buf()

wait_for("the oom-lsp client to attach", function()
  return #vim.lsp.get_clients({ bufnr = buf, name = "oom_lsp" }) == 1
end)
local client = vim.lsp.get_clients({ bufnr = buf, name = "oom_lsp" })[1]
step("attached; position encoding " .. client.offset_encoding)

local function oom_diagnostics(code, bufnr)
  local found = {}
  for _, diagnostic in ipairs(vim.diagnostic.get(bufnr or buf)) do
    if diagnostic.source == "oom-lsp" and (code == nil or diagnostic.code == code) then
      table.insert(found, diagnostic)
    end
  end
  table.sort(found, function(a, b) return a.lnum < b.lnum end)
  return found
end

wait_for("two OOM501 diagnostics", function()
  return #oom_diagnostics("OOM501") == 2
end)
local first = oom_diagnostics("OOM501")[1]
if first.severity ~= vim.diagnostic.severity.ERROR then
  fail("the oomLsp.severity setting did not reach the server (severity " .. tostring(first.severity) .. ")")
end
step("diagnostics: " .. #oom_diagnostics() .. " from oom-lsp, OOM501 as an error (workspace/configuration answered)")

-- The hover on a diagnostic is a summary, not the rule's page: the message, why, the fix, a link.
local hovered = vim.lsp.buf_request_sync(buf, "textDocument/hover", {
  textDocument = { uri = vim.uri_from_bufnr(buf) },
  position = { line = first.lnum, character = first.col },
}, timeout_ms)
local summary = hovered and hovered[client.id] and hovered[client.id].result
summary = summary and summary.contents.value or ""
local summary_lines = #vim.split(summary, "\n")
if summary_lines >= HOVER_LINES then
  fail("the hover has " .. summary_lines .. " lines:\n" .. summary)
end
-- Paragraphs come wrapped between words (the float would wrap a longer line at any character):
-- read as one line each.
local flowing = summary:gsub("%s+", " ")
-- The message's first line; the quick fix's "help: ..." line follows it in the diagnostic.
local message_line = vim.split(first.message, "\n")[1]
if first.message ~= message_line .. '\n\nhelp: Pass `map_location="cpu"`' then
  fail("the diagnostic's message has no help line with the fix's title: " .. first.message)
end
for _, expected in ipairs({
  message_line,
  'Quick fix: Pass `map_location="cpu"`',
  "the one they were saved from",
  "https://github.com/oom-lsp/oom-lsp/blob/main/docs/rules.md#torch-load-without-map-location-oom501",
  "`oom-lsp rule OOM501`",
}) do
  if not flowing:find(expected, 1, true) then
    fail("the hover lacks " .. expected .. ":\n" .. summary)
  end
end
for _, text in ipairs(vim.split(summary, "\n")) do
  if vim.fn.strdisplaywidth(text) > 78 and not text:find("](", 1, true) then
    fail("a hover line longer than 78 columns, which the float would break mid-word: " .. text)
  end
end
if summary:find("## ", 1, true) or summary:find("```", 1, true) then
  fail("the hover is the rule's page, not a summary:\n" .. summary)
end
step("hover: " .. summary_lines .. " lines, the message, why, the quick fix and the rule's page")

-- The float K opens (vim.lsp.buf.hover()), as the user sees it: a border (winborder), and the
-- `oom-lsp rule OOM501` line whole on one screen row (the float wraps at its width).
local function hover_float()
  for _, win in ipairs(vim.api.nvim_list_wins()) do
    local config = vim.api.nvim_win_get_config(win)
    if config.relative ~= "" then
      return win, config
    end
  end
end
vim.api.nvim_win_set_cursor(0, { first.lnum + 1, first.col })
vim.lsp.buf.hover()
wait_for("the hover float", function()
  return hover_float() ~= nil
end)
local float, float_config = hover_float()
local border = float_config.border
if border == nil or border == "none" or (type(border) == "table" and (#border == 0 or border[1] == "")) then
  fail("the hover float has no border: " .. vim.inspect(border))
end
local float_width = vim.api.nvim_win_get_width(float)
local command_row
for _, text in ipairs(vim.api.nvim_buf_get_lines(vim.api.nvim_win_get_buf(float), 0, -1, false)) do
  if text:find("oom-lsp rule OOM501", 1, true) then
    command_row = text
  end
end
if command_row == nil then
  fail("the hover float lacks `oom-lsp rule OOM501` on one line")
end
if vim.fn.strdisplaywidth(command_row) > float_width then
  fail("the float (" .. float_width .. " columns) wraps `" .. command_row .. "`")
end
vim.api.nvim_win_close(float, true)
step("hover float: a " .. (type(border) == "table" and "custom" or border) .. " border, " .. float_width
  .. " columns, `oom-lsp rule OOM501` on one row")

local function text_at(bufnr, lnum)
  return vim.api.nvim_buf_get_lines(bufnr, lnum, lnum + 1, true)[1]
end

local function line(lnum)
  return text_at(buf, lnum)
end

-- A filter matching several actions would open a selection prompt, which a
-- headless run answers with end-of-input and quits: make that a failure.
vim.ui.select = function(items)
  fail("code_action matched " .. #items .. " actions instead of one")
end

local function apply_action(diagnostic, title)
  vim.api.nvim_win_set_cursor(0, { diagnostic.lnum + 1, diagnostic.col })
  vim.lsp.buf.code_action({
    apply = true,
    context = { only = { "quickfix" } },
    filter = function(action)
      return action.title:find(title, 1, true) ~= nil
    end,
  })
end

-- The quick fix on the first torch.load.
local fixed_lnum = first.lnum
apply_action(first, '(OOM501): Pass map_location="cpu"')
wait_for("the quick fix to change the buffer", function()
  return line(fixed_lnum):find('map_location="cpu"', 1, true) ~= nil
end)
step("quick fix applied: " .. vim.trim(line(fixed_lnum)))

wait_for("one OOM501 left", function()
  return #oom_diagnostics("OOM501") == 1
end)

-- Ignore the second one for its line.
local second = oom_diagnostics("OOM501")[1]
local ignored_lnum = second.lnum
apply_action(second, "(OOM501): Ignore OOM501 for this line")
wait_for("the ignore comment", function()
  return line(ignored_lnum):find("# oom: ignore[OOM501]", 1, true) ~= nil
end)
wait_for("no OOM501 left", function()
  return #oom_diagnostics("OOM501") == 0
end)
step("ignored for its line: " .. vim.trim(line(ignored_lnum)))

-- A rule from another family: the loss accumulated with its graph (OOM301).
wait_for("an OOM301 diagnostic", function()
  return #oom_diagnostics("OOM301") == 1
end)
local accumulated = oom_diagnostics("OOM301")[1]
apply_action(accumulated, "(OOM301): Accumulate")
wait_for("the OOM301 quick fix", function()
  return line(accumulated.lnum):find("total_loss += loss.detach()", 1, true) ~= nil
end)
step("OOM301 quick fix applied: " .. vim.trim(line(accumulated.lnum)))

-- Hover on the suppression comment's code shows the rule's docs.
local ignored_line = line(ignored_lnum)
local code_column = ignored_line:find("OOM501", 1, true)
local params = {
  textDocument = { uri = vim.uri_from_bufnr(buf) },
  position = { line = ignored_lnum, character = code_column },
}
local responses = vim.lsp.buf_request_sync(buf, "textDocument/hover", params, timeout_ms)
local hover = responses and responses[client.id] and responses[client.id].result
if not hover or not hover.contents.value:find("torch-load-without-map-location", 1, true) then
  fail("hover on the suppressed code did not show the rule docs: " .. vim.inspect(responses))
end
step("hover shows the rule docs")

-- No light bulb on a clean line: an automatic request (as a light-bulb plugin or VS Code sends
-- on every cursor move) on a line of the training loop with nothing wrong gets no action; the
-- loop's header line gets the rewrite, and so does the clean line when the user asks.
local function actions_at(lnum, trigger_kind)
  local lsp_line = vim.api.nvim_buf_get_lines(buf, lnum, lnum + 1, true)[1]
  local column = #lsp_line - #vim.trim(lsp_line)
  local position = { line = lnum, character = column }
  local answers = vim.lsp.buf_request_sync(buf, "textDocument/codeAction", {
    textDocument = { uri = vim.uri_from_bufnr(buf) },
    range = { start = position, ["end"] = position },
    context = { diagnostics = {}, triggerKind = trigger_kind },
  }, timeout_ms)
  local titles = {}
  for _, action in ipairs(answers and answers[client.id] and answers[client.id].result or {}) do
    table.insert(titles, action.title)
  end
  return titles
end

local function line_of(text)
  for lnum, content in ipairs(vim.api.nvim_buf_get_lines(buf, 0, -1, true)) do
    if vim.trim(content) == text then
      return lnum - 1
    end
  end
  fail("no line " .. text)
end

local AUTOMATIC, INVOKED = 2, 1
local clean_line, header_line = line_of("optimizer.step()"), line_of("for inputs, targets in loader:")
local on_clean = actions_at(clean_line, AUTOMATIC)
if #on_clean ~= 0 then
  fail("an automatic request on a clean line got actions: " .. table.concat(on_clean, ", "))
end
if not vim.tbl_contains(actions_at(header_line, AUTOMATIC), "oom-lsp: Insert memory monitoring (needs oom-lsp where it trains)") then
  fail("the loop's header line did not offer Insert memory monitoring")
end
if not vim.tbl_contains(actions_at(clean_line, INVOKED), "oom-lsp: Insert memory monitoring (needs oom-lsp where it trains)") then
  fail("asked for (triggerKind Invoked), the loop's body did not offer Insert memory monitoring")
end
step("light bulb: no action on a clean line of the loop as the cursor moves; its header offers the rewrite")

-- Every message the fixtures get fits the width an editor shows: what Neovim pulls for each
-- file it opens, recorded by wrapping its handler.
local pulled = {}
local pull_handler = vim.lsp.handlers["textDocument/diagnostic"]
vim.lsp.handlers["textDocument/diagnostic"] = function(err, result, ctx, config)
  if not err and result and result.kind == "full" then
    pulled[ctx.params.textDocument.uri] = result.items
  end
  return pull_handler(err, result, ctx, config)
end
local files = vim.fn.globpath(fixtures, "**/*.py", false, true)
table.sort(files)
local messages, longest, codes = 0, "", {}
for _, path in ipairs(files) do
  vim.cmd.edit(path)
  local uri = vim.uri_from_bufnr(vim.api.nvim_get_current_buf())
  wait_for("the diagnostics of " .. path, function()
    return pulled[uri] ~= nil
  end)
  for _, item in ipairs(pulled[uri]) do
    messages = messages + 1
    codes[item.code] = true
    -- Each line: the message, and the quick fix's "help: ..." line where there is one.
    for _, text in ipairs(vim.split(item.message, "\n", { trimempty = true })) do
      if #text > #longest then
        longest = text
      end
      if #text >= MESSAGE_LIMIT then
        fail(path .. ": " .. #text .. " characters: " .. text)
      end
    end
  end
end
local seen = vim.tbl_keys(codes)
table.sort(seen)
step("messages: " .. messages .. " on " .. #files .. " fixtures, longest " .. #longest
  .. " characters, codes " .. table.concat(seen, ","))

-- The autocast quick fix on the common loop shape, and the estimate's peak before and after.
vim.cmd.edit(classifier)
local trainer = vim.api.nvim_get_current_buf()
wait_for("OOM201 on the training loop", function()
  return #oom_diagnostics("OOM201", trainer) == 1
end)

local function execute(command, arguments)
  local finished, answer, problem = false, nil, nil
  client:exec_cmd({ title = command, command = command, arguments = { arguments } }, { bufnr = trainer },
    function(err, result)
      finished, answer, problem = true, result, err
    end)
  if not vim.wait(estimate_ms, function() return finished end, 100) then
    fail("timed out waiting for " .. command)
  end
  if problem then
    fail(command .. ": " .. vim.inspect(problem))
  end
  return answer
end

local trainer_uri = vim.uri_from_bufnr(trainer)

-- The estimate from its lens (drawn by the refresh autocmd), as vim.lsp.codelens.run() runs it.
local function estimate_lens()
  for _, lens in ipairs(vim.lsp.codelens.get(trainer)) do
    if lens.command and lens.command.command == "oom-lsp.estimate" then
      return lens
    end
  end
end
wait_for("the estimate lens", function() return estimate_lens() ~= nil end)
local lens = estimate_lens()
if lens.command.title ~= "Estimate peak memory (24 GiB RTX 3090)" then
  fail("the lens does not name the oomLsp.gpu target: " .. lens.command.title)
end
-- :lua vim.lsp.codelens.run() on the lens's line, the estimate picked from the menu of its lenses.
local estimated, estimate_failed
local on_result = vim.lsp.handlers["workspace/executeCommand"]
vim.lsp.handlers["workspace/executeCommand"] = function(err, result, ctx, config)
  if ctx.params and ctx.params.command == "oom-lsp.estimate" then
    estimated, estimate_failed = result, err
  end
  return on_result and on_result(err, result, ctx, config)
end
local pick = vim.ui.select
vim.ui.select = function(options, opts, on_choice)
  for _, option in ipairs(options) do
    if opts.format_item(option) == lens.command.title then
      return on_choice(option)
    end
  end
  fail("the lens menu has no " .. lens.command.title)
end
vim.api.nvim_win_set_cursor(0, { lens.range.start.line + 1, 0 })
vim.lsp.codelens.run()
vim.ui.select = pick
if not vim.wait(estimate_ms, function() return estimated ~= nil or estimate_failed ~= nil end, 100) then
  fail("timed out waiting for the lens's estimate")
end
if estimate_failed then
  fail("the lens's estimate: " .. vim.inspect(estimate_failed))
end

-- The verdict is visible: a message (in :messages), the inlay hint, the lens's new title.
local said = "] oom-lsp: " .. estimated.message -- "LSP[oom_lsp][Info]", [Warning] when it does not fit
if not vim.fn.execute("messages"):find(said, 1, true) then
  fail("no message with the estimate's verdict; :messages has:\n" .. vim.fn.execute("messages"))
end
local target = estimated.message:match(" / 24 GiB RTX 3090: [%a ]+")
if not target then
  fail("the message names no target and verdict: " .. estimated.message)
end
-- The hint leads with the verdict and the target: "fits on 24 GiB RTX 3090: ≈ ...".
local gpu, verdict = estimated.message:match(" / (24 GiB RTX 3090): ([%a ]-)[.;]")
local hint_start = verdict and (verdict .. " on " .. gpu .. ": ")
if not hint_start then
  fail("the message names no target and verdict: " .. estimated.message)
end
local hint_label
wait_for("the estimate's inlay hint", function()
  for _, item in ipairs(vim.lsp.inlay_hint.get({ bufnr = trainer })) do
    local label = item.inlay_hint.label
    if type(label) == "string" and vim.startswith(label, hint_start) then
      hint_label = label
      return true
    end
  end
  return false
end)
wait_for("the estimate lens to say the result", function()
  local now = estimate_lens()
  return now ~= nil and vim.startswith(now.command.title, "Estimated ≈") and now.command.title:find(target, 1, true)
end)
local estimating = vim.tbl_filter(function(title) return vim.startswith(title, "Estimating ") end, progress.begun)
if #estimating == 0 or progress.ended == 0 then
  fail("no work-done progress for the estimate: began " .. vim.inspect(progress.begun))
end
step("estimate: " .. estimated.message)
step("progress: " .. estimating[1])
step("hint: " .. hint_label .. " | lens: " .. estimate_lens().command.title)
local loop = oom_diagnostics("OOM201", trainer)[1]
vim.api.nvim_win_set_cursor(0, { loop.lnum + 1, loop.col })
vim.lsp.buf.code_action({
  apply = true,
  context = { only = { "quickfix" } },
  filter = function(action)
    return action.title:find("(OOM201): Wrap the forward pass and the loss in", 1, true) ~= nil
  end,
})
wait_for("the autocast fix", function()
  for _, text in ipairs(vim.api.nvim_buf_get_lines(trainer, 0, -1, true)) do
    if text:find('with torch.autocast(device_type="cuda", dtype=torch.bfloat16):', 1, true) then
      return true
    end
  end
  return false
end)
vim.cmd.write()
wait_for("OOM201 to go", function()
  return #oom_diagnostics("OOM201", trainer) == 0
end)
local validated = execute("oom-lsp.validateFix", { uri = trainer_uri })
if not (validated.source == "estimate" and validated.before == estimated.peakBytes) then
  fail("validateFix did not compare with the estimate: " .. vim.inspect(validated))
end
if validated.after >= validated.before then
  fail("the estimated peak did not drop: " .. vim.inspect(validated))
end
step(string.format("autocast: estimated peak %d bytes before the fix, %d after (%.0f%%)", validated.before,
  validated.after, 100 * (validated.after - validated.before) / validated.before))
vim.cmd.buffer(buf)

-- Fix all on save, with the BufWritePre autocommand docs/editors.md shows.
vim.api.nvim_create_autocmd("BufWritePre", {
  pattern = "*.py",
  callback = function(args)
    local oom = vim.lsp.get_clients({ bufnr = args.buf, name = "oom_lsp" })[1]
    if not oom then return end
    local range_params = vim.lsp.util.make_range_params(0, oom.offset_encoding)
    range_params.context = { only = { "source.fixAll.oom-lsp" }, diagnostics = {} }
    local response = oom:request_sync("textDocument/codeAction", range_params, 3000, args.buf)
    for _, action in ipairs(response and response.result or {}) do
      if action.edit then
        vim.lsp.util.apply_workspace_edit(action.edit, oom.offset_encoding)
      end
    end
  end,
})
local last = vim.api.nvim_buf_line_count(buf)
vim.api.nvim_buf_set_lines(buf, last, last, true, { 'model.load_state_dict(torch.load("best.pt"))' })
wait_for("a diagnostic on the new line", function()
  return #oom_diagnostics("OOM501") == 1
end)
vim.cmd.write()
if line(last) ~= 'model.load_state_dict(torch.load("best.pt", map_location="cpu", weights_only=True))' then
  fail("fix all on save did not fix the new line: " .. line(last))
end
step("fix all on save: " .. line(last))

-- The AI fix, chosen once in vim.lsp.buf.code_action(): its change is in the buffer (the
-- server's workspace/applyEdit, no confirmation), then written.
if ai_file then
  vim.cmd.edit(ai_file)
  local ai_buf = vim.api.nvim_get_current_buf()
  wait_for("OOM301 in " .. ai_file, function()
    return #oom_diagnostics("OOM301", ai_buf) == 1
  end)
  local accumulated = oom_diagnostics("OOM301", ai_buf)[1]
  vim.api.nvim_win_set_cursor(0, { accumulated.lnum + 1, accumulated.col })
  local offered
  vim.lsp.buf.code_action({
    apply = true,
    context = { only = { "quickfix" } },
    filter = function(action)
      if action.title:find("Ask AI to fix (OOM301)", 1, true) then
        offered = action.title
        return true
      end
      return false
    end,
  })
  wait_for("the AI fix in the buffer", function()
    return vim.trim(text_at(ai_buf, accumulated.lnum)) == "total_loss += loss.item()"
  end)
  vim.cmd.write()
  step("ai fix: " .. offered .. ": applied on the first choice: " .. vim.trim(text_at(ai_buf, accumulated.lnum)))
end

client:stop()
wait_for("the server to stop", function()
  return client:is_stopped()
end)
step("server stopped")
vim.cmd("qall!")
