-- Ditto's commands, available before setup() (each loads the module on first use).
if vim.g.loaded_ditto then
  return
end
vim.g.loaded_ditto = true

local function cmd(name, fn, desc)
  vim.api.nvim_create_user_command(name, function()
    require('ditto')[fn]()
  end, { desc = desc })
end
cmd('DittoStats', 'stats', 'Ditto: server statistics (ditto/stats)')
cmd('DittoTrace', 'trace', "Ditto: the last completion's propose/verify rounds (ditto/trace)")
cmd('DittoToggle', 'toggle', 'Ditto: suggestions on/off in this buffer')
