--- :checkhealth ditto — the server command, the model setting and the editor features found.
local M = {}

function M.check()
  local health = vim.health
  local ok_ditto, ditto = pcall(require, 'ditto')

  health.start('Ditto: editor features')
  if not (vim.lsp.config and vim.lsp.enable) then
    health.error('vim.lsp.config / vim.lsp.enable not found: Ditto needs Neovim 0.11 or newer')
  else
    health.ok('vim.lsp.config and vim.lsp.enable found')
  end
  if vim.lsp.inline_completion and vim.lsp.inline_completion.enable then
    health.ok('vim.lsp.inline_completion found: suggestions show as ghost text')
  elseif vim.lsp.completion and vim.lsp.completion.enable then
    health.warn('vim.lsp.inline_completion not found: suggestions show in the completion menu '
      .. '(vim.lsp.completion fallback, first line only)', { 'Neovim 0.12+ shows ghost text' })
  else
    health.error('neither vim.lsp.inline_completion nor vim.lsp.completion found')
  end
  if ok_ditto and ditto.opts.next_edit ~= false then
    local keys = ditto.opts.keymaps or {}
    health.ok(('next-edit suggestions: on (jump/apply %s, dismiss %s)'):format(
      keys.next_edit or 'unmapped', keys.dismiss or 'unmapped'))
  else
    health.info('next-edit suggestions: off (setup({ next_edit = false }))')
  end

  health.start('Ditto: server')
  local config = vim.lsp.config and vim.lsp.config[ok_ditto and ditto.name or 'ditto'] or nil
  if not config or not config.cmd then
    health.error("no 'ditto' LSP config found: is editors/nvim on 'runtimepath'?")
    return
  end
  if type(config.cmd) == 'function' then
    health.info('server command: a Lua function (cannot check it)')
  else
    local exe = config.cmd[1]
    local path = vim.fn.exepath(exe)
    if path ~= '' then
      health.ok(('server command: %s (%s)'):format(table.concat(config.cmd, ' '), path))
    else
      health.error(('server command: %s — %s not found on PATH'):format(table.concat(config.cmd, ' '), exe), {
        'pip install ditto-lsp into a virtualenv and put its bin/ on PATH',
        "or set the full path: require('ditto').setup({ cmd = { '/path/to/venv/bin/ditto-lsp', 'serve' } })",
      })
    end
  end
  local init = config.init_options or {}
  health.info(('model: %s'):format(init.model or '(server default)'))
  health.info(('drafter: %s'):format(init.drafter or '(server default)'))
  if vim.lsp.is_enabled and not vim.lsp.is_enabled('ditto') then
    health.warn("vim.lsp.enable('ditto') has not been called", { "call require('ditto').setup()" })
  end

  local clients = vim.lsp.get_clients({ name = 'ditto' })
  if #clients == 0 then
    health.info('no ditto-lsp client running (open a file of a configured filetype)')
  end
  for _, client in ipairs(clients) do
    local caps = client.server_capabilities or {}
    health.ok(('client %d running (root %s); server offers inline completion: %s, completion: %s'):format(
      client.id, client.root_dir or '-', caps.inlineCompletionProvider and 'yes' or 'no',
      caps.completionProvider and 'yes' or 'no'))
  end
end

return M
