-- Headless Neovim 0.11 end-to-end check of oom-lsp, configured the way
-- docs/editors.md tells users to (vim.lsp.config + vim.lsp.enable, no plugin).
--
--   OOM_PY=<python with oom-lsp> OOM_FILE=<scratch copy of a risky file> \
--     nvim --headless --clean -l tests/e2e/neovim_e2e.lua
--
-- Exits 0 when every check passes; otherwise prints "FAIL: ..." on stderr and exits 1.

local python = assert(os.getenv("OOM_PY"), "OOM_PY is not set")
local file = assert(os.getenv("OOM_FILE"), "OOM_FILE is not set")
local timeout_ms = tonumber(os.getenv("OOM_TIMEOUT_MS") or "30000")

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

vim.lsp.config("oom_lsp", {
  cmd = { python, "-m", "oom_lsp" },
  filetypes = { "python" },
  root_markers = { "pyproject.toml", ".git" },
  settings = { oomLsp = { severity = { OOM501 = "error" } } },
})
vim.lsp.enable("oom_lsp")

vim.cmd.edit(file)
local buf = vim.api.nvim_get_current_buf()

wait_for("the oom-lsp client to attach", function()
  return #vim.lsp.get_clients({ bufnr = buf, name = "oom_lsp" }) == 1
end)
local client = vim.lsp.get_clients({ bufnr = buf, name = "oom_lsp" })[1]
step("attached; position encoding " .. client.offset_encoding)

local function oom_diagnostics(code)
  local found = {}
  for _, diagnostic in ipairs(vim.diagnostic.get(buf)) do
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

local function line(lnum)
  return vim.api.nvim_buf_get_lines(buf, lnum, lnum + 1, true)[1]
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
apply_action(first, '(OOM501): Pass `map_location="cpu"`')
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

client:stop()
wait_for("the server to stop", function()
  return client:is_stopped()
end)
step("server stopped")
vim.cmd("qall!")
