-- Ditto: inline ("ghost text") code completions from a local code model.
--
-- The configuration for vim.lsp.config / vim.lsp.enable('ditto') (Neovim 0.11+). Override
-- any field the usual way, e.g.
--   vim.lsp.config('ditto', { cmd = { '/path/to/venv/bin/ditto-lsp', 'serve' } })
-- or through require('ditto').setup({ cmd = ..., model = ..., drafter = ... }).
---@type vim.lsp.Config
return {
  cmd = { 'ditto-lsp', 'serve' },
  filetypes = {
    'c', 'cpp', 'cs', 'css', 'dart', 'elixir', 'go', 'haskell', 'html', 'java', 'javascript',
    'javascriptreact', 'json', 'julia', 'kotlin', 'lua', 'make', 'markdown', 'ocaml', 'perl', 'php',
    'python', 'r', 'ruby', 'rust', 'scala', 'sh', 'sql', 'swift', 'toml', 'typescript',
    'typescriptreact', 'vim', 'yaml', 'zig',
  },
  root_markers = { '.git', 'pyproject.toml', 'package.json', 'Cargo.toml', 'go.mod' },
  -- Sent as initializationOptions. model: default | qwen2.5-coder-0.5b | qwen2.5-coder-1.5b |
  -- tiny-random | FILE.gguf | DIR | hub id; drafter: none | ngram | model | hybrid. Any other server
  -- setting goes here too, or as a require('ditto').setup() option of the same name.
  init_options = {
    model = 'default',
    drafter = 'ngram',
  },
  handlers = {
    -- The server's notification that its model finished loading: re-ask once (lua/ditto/init.lua).
    ['ditto/modelReady'] = function(_, _, ctx)
      require('ditto').model_ready(ctx.client_id)
    end,
  },
}
