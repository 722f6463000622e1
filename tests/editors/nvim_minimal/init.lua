-- Minimal Neovim (0.12+) config for the real-editor test: Ditto as the only LSP server,
-- inline completion on. Environment: DITTO_CMD (JSON list: the server command),
-- DITTO_FILE (the Python file to open), DITTO_OUT (where the result JSON goes).
local cmd = vim.json.decode(os.getenv('DITTO_CMD'))
local out = os.getenv('DITTO_OUT')

local function finish(result)
  local f = assert(io.open(out, 'w'))
  f:write(vim.json.encode(result))
  f:close()
  vim.cmd('qall!')
end

if not (vim.lsp and vim.lsp.inline_completion) then
  finish({ error = 'no vim.lsp.inline_completion in this Neovim' })
  return
end

local ns = vim.api.nvim_create_namespace('nvim.lsp.inline_completion')
vim.lsp.inline_completion.enable(true)

vim.cmd.edit(os.getenv('DITTO_FILE'))
local buf = vim.api.nvim_get_current_buf()
local before = table.concat(vim.api.nvim_buf_get_lines(buf, 0, -1, false), '\n')

vim.lsp.start({ name = 'ditto', cmd = cmd, root_dir = vim.fn.getcwd() })

local function ghost()
  local marks = vim.api.nvim_buf_get_extmarks(buf, ns, 0, -1, { details = true })
  for _, m in ipairs(marks) do
    local d = m[4]
    local parts = {}
    for _, chunk in ipairs(d.virt_text or {}) do table.insert(parts, chunk[1]) end
    for _, vl in ipairs(d.virt_lines or {}) do
      table.insert(parts, '\n')
      for _, chunk in ipairs(vl) do table.insert(parts, chunk[1]) end
    end
    return table.concat(parts)
  end
end

local after_insert
-- Wait (event loop running, no fixed sleep) for the server to attach and its model to load.
local client
local function start()
local attached = vim.wait(60000, function()
  return #vim.lsp.get_clients({ bufnr = buf, name = 'ditto' }) > 0
end, 50)
if not attached then return finish({ error = 'ditto did not attach' }) end
client = vim.lsp.get_clients({ bufnr = buf, name = 'ditto' })[1]
local ready = vim.wait(60000, function()
  local r = client:request_sync('ditto/stats', {}, 5000, buf)
  return r and r.result and r.result.model_state == 'ready'
end, 200)
if not ready then return finish({ error = 'model not ready' }) end

-- Cursor at the end of the file, insert mode (typed, so InsertEnter fires): Neovim requests automatically.
vim.api.nvim_win_set_cursor(0, { vim.api.nvim_buf_line_count(buf), #vim.fn.getline('$') })
vim.api.nvim_create_autocmd('InsertEnter', { once = true, callback = function() vim.schedule(after_insert) end })
vim.api.nvim_feedkeys('A', 'n', false)
end

after_insert = function()
local shown
vim.wait(60000, function()
  shown = ghost()
  return shown ~= nil and shown ~= ''
end, 50)
if not shown then return finish({ error = 'no ghost text appeared' }) end

local accepted = vim.lsp.inline_completion.get()
local after
vim.wait(5000, function()
  after = table.concat(vim.api.nvim_buf_get_lines(buf, 0, -1, false), '\n')
  return after ~= before
end, 20)
local stats = client:request_sync('ditto/stats', {}, 5000, buf)
finish({ ghost = shown, accepted = accepted, before = before, after = after,
         stats = stats and stats.result, encoding = client.offset_encoding })
end

vim.schedule(start)
