-- Headless Neovim 0.11: the what-if through the user's path. The "What if…" lens is offered,
-- `oom-lsp.whatIf` opens the table beside the file (window/showDocument without focus: Neovim
-- opens the .md file in a new split, the file keeps its window), and the
-- quick fixes listed by vim.lsp.buf.code_action() carry their measured saving.
--
--   OOM_PY=<python with oom-lsp> OOM_FILE=<copy of fixtures/estimate/whatif/small_loop.py> \
--     nvim --headless --clean -l tests/e2e/neovim_what_if.lua
--
-- Exits 0 when every check passes; otherwise prints "FAIL: ..." on stderr and exits 1.

local python = assert(os.getenv("OOM_PY"), "OOM_PY is not set")
local file = assert(os.getenv("OOM_FILE"), "OOM_FILE is not set")
local timeout_ms = tonumber(os.getenv("OOM_TIMEOUT_MS") or "30000")
-- One trace per change: about 40 s on two idle cores.
local what_if_ms = tonumber(os.getenv("OOM_WHAT_IF_TIMEOUT_MS") or "600000")

local function fail(message)
  io.stderr:write("FAIL: " .. message .. "\n")
  os.exit(1)
end

local function step(message)
  io.stdout:write("ok: " .. message .. "\n")
end

local function wait_for(what, predicate, ms)
  if not vim.wait(ms or timeout_ms, predicate, 50) then
    fail("timed out waiting for " .. what)
  end
end

vim.lsp.config("oom_lsp", {
  cmd = { python, "-m", "oom_lsp" },
  filetypes = { "python" },
  root_markers = { "pyproject.toml", ".git" },
})
vim.lsp.enable("oom_lsp")

vim.cmd.edit(file)
local buf = vim.api.nvim_get_current_buf()
local uri = vim.uri_from_bufnr(buf)
wait_for("the oom-lsp client to attach", function()
  return #vim.lsp.get_clients({ bufnr = buf, name = "oom_lsp" }) == 1
end)
local client = vim.lsp.get_clients({ bufnr = buf, name = "oom_lsp" })[1]

local function retain_graph()
  for _, diagnostic in ipairs(vim.diagnostic.get(buf)) do
    if diagnostic.source == "oom-lsp" and diagnostic.code == "OOM304" then
      return diagnostic
    end
  end
end
wait_for("the OOM304 diagnostic", function() return retain_graph() ~= nil end)

local lenses = vim.lsp.buf_request_sync(buf, "textDocument/codeLens", { textDocument = { uri = uri } }, timeout_ms)
local what_if_lenses = 0
for _, lens in ipairs(lenses and lenses[client.id] and lenses[client.id].result or {}) do
  if lens.command.command == "oom-lsp.whatIf" and lens.command.title == "What if…" then
    what_if_lenses = what_if_lenses + 1
  end
end
if what_if_lenses == 0 then
  fail("no What if… lens")
end
step("lens: What if… on " .. what_if_lenses .. " lines")

-- The titles the quick-fix menu lists for OOM304, through the user's command.
local function fix_titles()
  local diagnostic = retain_graph()
  vim.api.nvim_set_current_buf(buf)
  vim.api.nvim_win_set_cursor(0, { diagnostic.lnum + 1, diagnostic.col })
  local titles, listed = {}, false
  vim.lsp.buf.code_action({
    context = { only = { "quickfix" } },
    filter = function(action)
      table.insert(titles, action.title)
      listed = true
      return false -- listed, not applied
    end,
  })
  wait_for("the code actions", function() return listed end)
  vim.wait(200)
  return titles
end

local function own_title(titles)
  for _, title in ipairs(titles) do
    if vim.startswith(title, "oom-lsp (OOM304): Drop") then
      return title
    end
  end
  fail("no OOM304 fix among: " .. table.concat(titles, " | "))
end

local before = own_title(fix_titles())
if before:find("% peak", 1, true) then
  fail("a saving before any what-if: " .. before)
end

local finished, answer, problem = false, nil, nil
client:exec_cmd({ title = "What if…", command = "oom-lsp.whatIf", arguments = { { uri = uri } } }, { bufnr = buf },
  function(err, result)
    finished, answer, problem = true, result, err
  end)
wait_for("oom-lsp.whatIf", function() return finished end, what_if_ms)
if problem then
  fail("oom-lsp.whatIf: " .. vim.inspect(problem))
end
local shown = vim.fn.bufnr(answer.markdownPath)
if shown < 0 or not answer.shown then
  fail("the table was not opened: " .. vim.inspect(answer))
end
-- Beside the file, never in its place: the file keeps its window and the cursor, the table
-- has a window of its own.
if vim.api.nvim_get_current_buf() ~= buf then
  fail("the table replaced the file in the current window")
end
if #vim.fn.win_findbuf(shown) == 0 or #vim.fn.win_findbuf(buf) == 0 then
  fail("the table and the file are not both shown: " .. #vim.api.nvim_list_wins() .. " windows")
end
step("what-if: the table in a split beside the file, the cursor still in the file")
local page = table.concat(vim.api.nvim_buf_get_lines(shown, 0, -1, true), "\n")
if not page:find("| change | peak | change in peak | growth/step | fits | safety |", 1, true) then
  fail("the table's buffer has no table:\n" .. page)
end
step("what-if: " .. #answer.changes .. " changes, the table opened in " .. vim.fn.fnamemodify(answer.markdownPath, ":t"))

local after = own_title(fix_titles())
if after:sub(1, #before) ~= before or not after:find("% peak (", 1, true) then
  fail("no saving in the title: " .. after)
end
step("title: " .. after)

client:stop()
wait_for("the server to stop", function() return client:is_stopped() end)
step("server stopped")
vim.cmd("qall!")
