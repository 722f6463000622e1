--- Ditto for Neovim: starts `ditto-lsp serve` through vim.lsp (config in lsp/ditto.lua) and shows
--- its suggestions as ghost text with vim.lsp.inline_completion where Neovim has it (0.12+), or
--- through the completion menu (vim.lsp.completion, 0.11) where it does not. Also :DittoStats and
--- :DittoTrace. Left out on purpose: anything the server decides (model, stop rules, timing).
local M = {}

M.name = 'ditto'

---@class ditto.Keymaps
---@field accept? string|false Insert mode: accept the ghost text (falls back to the key itself). Default '<Tab>'.
---@field accept_word? string|false Insert mode, 0.12+: accept the ghost text's next word (lua/ditto/partial.lua; falls back to the key itself). Default '<C-Right>'.
---@field accept_line? string|false Insert mode, 0.12+: accept the rest of the ghost text's line, or at a line's end the next line (falls back to the key itself). Default '<C-Down>'.
---@field next? string|false Insert mode: next suggestion. Default '<M-]>'.
---@field prev? string|false Insert mode: previous suggestion. Default '<M-['>.
---@field trigger? string|false Insert mode, 0.11 fallback only: open the completion menu. Default '<C-Space>'.
---@field next_edit? string|false Normal and insert mode, while a next edit is shown: jump to it, then apply it (the key keeps its meaning otherwise; ghost text comes first). Default '<Tab>'.
---@field dismiss? string|false Normal and insert mode, while a next edit is shown: dismiss it (then the key does what it does). Default '<Esc>'.

--- Server settings: sent as initializationOptions. The names are the server's own (its Settings
--- fields, lsp_server/settings.py; `ditto-lsp serve --help` says what each does). Left unset, the
--- server's default holds. tests/lsp/test_settings_paths.py checks this list against the server's.
M.server_options = {
  'model', 'device', 'dtype', 'backend', 'trust_remote_code', 'remote', 'drafter', 'draft_model', 'max_tokens',
  'context_tokens', 'snippets', 'draft_max', 'temperature', 'top_p', 'top_k', 'seed', 'time_budget_s', 'multiline', 'adaptive', 'idle_prefill',
  'whole_file', 'show', 'learn_show', 'next_edit', 'next_edit_proposer',
  'first_answer_s', 'load_wait_s', 'index_memory_mb', 'definitions', 'recent_edits', 'definitions_share', 'edits_share',
}

---@class ditto.Opts
---@field cmd? string[] Server command. Default { 'ditto-lsp', 'serve' }.
---@field model? string default | qwen2.5-coder-0.5b | qwen2.5-coder-1.5b | tiny-random | FILE.gguf | ollama:NAME[:TAG] | DIR | hub id | http[s]://HOST:PORT/v1#NAME (a team's engine, docs/team.md).
---@field device? string auto | cpu | cuda | cuda:N.
---@field dtype? string auto | float32 | bfloat16 | float16.
---@field backend? string auto | torch | llama.cpp (auto: llama.cpp for a GGUF model on a CPU).
---@field trust_remote_code? boolean Let a model directory's own Python code run. Default false.
---@field remote? table A remote engine's transport (model = 'http://HOST:PORT/v1#NAME'; docs/team.md): headers, caFile, body...
---@field drafter? string none | ngram | model | hybrid. Default 'ngram'.
---@field draft_model? string Draft model of the model and hybrid drafters (same tokenizer as model).
---@field max_tokens? integer Token budget of one suggestion.
---@field context_tokens? integer Prompt budget in tokens; 0 (default): fitted to the machine at load (smaller answers sooner at a new place).
---@field snippets? string What of the other open buffers the prompt holds: heads | similar | none. Default 'heads'.
---@field draft_max? integer Longest draft verified in one model pass (0 = plain decoding).
---@field temperature? number 0 = greedy.
---@field top_p? number
---@field top_k? integer
---@field seed? integer|vim.NIL Sampling seed.
---@field time_budget_s? number|vim.NIL Seconds one suggestion may take (vim.NIL = no limit).
---@field multiline? boolean Suggestions may span lines.
---@field adaptive? boolean Choose each draft's length from measured pass costs. Default true.
---@field idle_prefill? boolean Prefill the next prompt, and start its suggestion, while you pause. Default true.
---@field whole_file? boolean The whole file above the cursor from a warm KV per file, filled while you pause. Default false.
---@field show? string What of a suggestion is shown: all | sure (up to where the model becomes unsure) | surest. Default 'sure'.
---@field learn_show? boolean Let what you accept and type over move `show`'s limit a little (per workspace). Default true.
---@field next_edit_proposer? string Who proposes the next edit: propagate (no model) | rewrite | both | judged (the model; judged is right a little more often than propagate, with a third fewer wrong, at seconds of CPU a proposal: docs/nextedit.md). Default 'propagate'.
---@field first_answer_s? number|vim.NIL Answer at the first complete line, or after this many seconds of decoding (vim.NIL = wait for all). Default 1.
---@field load_wait_s? number Seconds a request made while the model loads waits for it (0 = none). Default 120.
---@field index_memory_mb? integer Memory for the drafter's index of the open buffers, in MB. Default 64.
---@field definitions? boolean The definitions of the names used around the cursor in the prompt (resolved while you pause). Default true.
---@field recent_edits? boolean Your recent edits that share a name with the lines around the cursor in the prompt. Default true.
---@field definitions_share? number The prompt's share, at most, for the definitions (0 to 0.5). Default 0.2.
---@field edits_share? number The prompt's share, at most, for the recent edits (0 to 0.5). Default 0.1.
---@field init_options? table Further initializationOptions, under the options above.
---@field filetypes? string[] Filetypes to attach to.
---@field enable? boolean Call vim.lsp.enable('ditto'). Default true.
---@field keymaps? ditto.Keymaps|false false: set no keymaps.
---@field next_edit? boolean Next-edit suggestions (lua/ditto/nextedit.lua), and the server's ghost text that makes the next edit on the cursor's line. Default true.

local client_options = {
  cmd = true, filetypes = true, enable = true, keymaps = true, init_options = true,
}

---@type ditto.Opts
M.defaults = {
  enable = true,
  keymaps = {
    accept = '<Tab>', accept_word = '<C-Right>', accept_line = '<C-Down>', next = '<M-]>', prev = '<M-[>',
    trigger = '<C-Space>', next_edit = '<Tab>', dismiss = '<Esc>',
  },
  next_edit = true,
}

---@type ditto.Opts
M.opts = vim.deepcopy(M.defaults)

--- Which client-side feature shows the suggestions in this Neovim: checked by feature, not version.
---@return 'inline_completion'|'completion'|nil
function M.mode()
  if vim.lsp.inline_completion and vim.lsp.inline_completion.enable then
    return 'inline_completion'
  elseif vim.lsp.completion and vim.lsp.completion.enable then
    return 'completion'
  end
end

---@param bufnr? integer
---@return vim.lsp.Client?
function M.client(bufnr)
  local clients = vim.lsp.get_clients({ name = M.name, bufnr = bufnr })
  if #clients == 0 and bufnr then
    clients = vim.lsp.get_clients({ name = M.name })
  end
  return clients[1]
end

local function first_line(s)
  return (s:match('^[^\n]*'))
end

--- 0.11 fallback: show the suggestion's first line in the menu and insert that line, not the first
--- whitespace-delimited word (Neovim's default for items with a textEdit).
---@param item lsp.CompletionItem
local function convert(item)
  local text = (item.textEdit and item.textEdit.newText) or item.insertText or item.label
  return { word = first_line(text), abbr = first_line(item.label) }
end

local function map(bufnr, lhs, rhs, desc, expr, mode)
  if lhs and lhs ~= '' then
    vim.keymap.set(mode or 'i', lhs, rhs, { buffer = bufnr, expr = expr, silent = true, desc = desc })
  end
end

--- Next-edit keys (lua/ditto/nextedit.lua): each does its next-edit action while an edit is shown
--- and keeps its meaning otherwise. In insert mode, where the next-edit key is also the accept key,
--- init's accept mapping handles both, ghost text first.
local function map_next_edit(bufnr, keys, insert_shared)
  local ne = require('ditto.nextedit')
  local function on(key, action)
    return function()
      return action() or key
    end
  end
  for _, mode in ipairs({ 'n', 'i' }) do
    if not (mode == 'i' and insert_shared) then
      map(bufnr, keys.next_edit, on(keys.next_edit or '', ne.tab_keys), 'Ditto: jump to the next edit, then apply it',
        true, mode)
    end
    map(bufnr, keys.dismiss, function()
      local action = ne.dismiss_keys()
      if action and mode == 'n' then
        return action
      end
      return (action or '') .. keys.dismiss  -- insert mode: dismissed, and insert mode left
    end, 'Ditto: dismiss the next edit', true, mode)
  end
end

---@param client vim.lsp.Client
---@param bufnr integer
function M.attach(client, bufnr)
  local keys = M.opts.keymaps or {}
  local next_edit = M.opts.next_edit ~= false
  local shared = next_edit and keys.next_edit and keys.next_edit == keys.accept and M.mode() == 'inline_completion'
  if M.mode() == 'inline_completion' then
    vim.lsp.inline_completion.enable(true, { bufnr = bufnr })
    map(bufnr, keys.accept, function()
      if not vim.lsp.inline_completion.get() then
        return shared and require('ditto.nextedit').tab_keys() or keys.accept
      end
    end, 'Ditto: accept the suggestion', true)
    -- Part of it: the rest stays a suggestion (the server answers the next request by type-through).
    for kind, lhs in pairs({ word = keys.accept_word, line = keys.accept_line }) do
      map(bufnr, lhs, function()
        if not require('ditto.partial').accept(kind, bufnr) then
          return lhs
        end
      end, ('Ditto: accept the next %s of the suggestion'):format(kind), true)
    end
    map(bufnr, keys.next, function()
      vim.lsp.inline_completion.select({ count = 1 })
    end, 'Ditto: next suggestion')
    map(bufnr, keys.prev, function()
      vim.lsp.inline_completion.select({ count = -1 })
    end, 'Ditto: previous suggestion')
  elseif M.mode() == 'completion' then
    vim.lsp.completion.enable(true, client.id, bufnr, { autotrigger = true, convert = convert })
    map(bufnr, keys.trigger, function()
      vim.lsp.completion.get()
    end, 'Ditto: show the suggestion in the completion menu')
  end
  if next_edit then
    require('ditto.nextedit').attach(client, bufnr)
    map_next_edit(bufnr, keys, shared)
  end
  M.follow_cursor(client, bufnr)
end

--- Tell the server where the cursor rests (`ditto/didMoveCursor`), so it prefills the prompt of
--- the next suggestion while you pause (docs/design.md, "Prompt layout and windows"). Sent 150 ms
--- after the cursor stops moving, in the client's position encoding.
---@param client vim.lsp.Client
---@param bufnr integer
function M.follow_cursor(client, bufnr)
  local timer = assert(vim.uv.new_timer())
  local group = vim.api.nvim_create_augroup(('ditto.cursor:%d'):format(bufnr), { clear = true })
  vim.api.nvim_create_autocmd({ 'CursorMoved', 'CursorMovedI' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      timer:stop()
      timer:start(150, 0, vim.schedule_wrap(function()
        if client:is_stopped() or vim.api.nvim_get_current_buf() ~= bufnr then
          return
        end
        local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
        client:notify('ditto/didMoveCursor', params)
      end))
    end,
  })
  vim.api.nvim_create_autocmd({ 'BufUnload', 'LspDetach' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      timer:stop()
      if not timer:is_closing() then
        timer:close()
      end
      pcall(vim.api.nvim_del_augroup_by_id, group)
    end,
  })
end

--- The server's `ditto/modelReady` notification (its model finished loading). The server answers
--- the requests made while it loaded, but an answer can still be lost on the way (the cursor moved,
--- a newer request replaced it): re-ask once for the current buffer if it is in insert mode.
---@param client_id integer
function M.model_ready(client_id)
  local bufnr = vim.api.nvim_get_current_buf()
  if not vim.api.nvim_get_mode().mode:match('^i') or not vim.lsp.buf_is_attached(bufnr, client_id) then
    return
  end
  if M.mode() == 'inline_completion' and vim.lsp.inline_completion.is_enabled({ bufnr = bufnr }) then
    -- vim.lsp.inline_completion has no "request now"; it requests on CursorMovedI, from an augroup
    -- named after the buffer. Fire that group only, or every CursorMovedI of the buffer if renamed.
    local group = ('nvim.lsp.inline_completion:%d'):format(bufnr)
    local ok = pcall(vim.api.nvim_exec_autocmds, 'CursorMovedI', { group = group, buffer = bufnr, modeline = false })
    if not ok then
      vim.api.nvim_exec_autocmds('CursorMovedI', { buffer = bufnr, modeline = false })
    end
  end
end

--- Show lines in a scratch buffer (a new split), named `name`.
---@param name string
---@param lines string[]
---@param filetype? string
function M.scratch(name, lines, filetype)
  vim.cmd('botright new')
  local buf = vim.api.nvim_get_current_buf()
  vim.bo[buf].buftype = 'nofile'
  vim.bo[buf].bufhidden = 'wipe'
  vim.bo[buf].swapfile = false
  pcall(vim.api.nvim_buf_set_name, buf, name)
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, lines)
  vim.bo[buf].modifiable = false
  if filetype then
    vim.bo[buf].filetype = filetype
  end
  return buf
end

local function render(result)
  if type(result) == 'string' then
    return vim.split(result, '\n', { plain = true })
  end
  return vim.split(vim.inspect(result), '\n', { plain = true })
end

--- Send a custom request to the Ditto client of the current buffer; on_result(result) on success.
local function request(method, params, on_result)
  local bufnr = vim.api.nvim_get_current_buf()
  local client = M.client(bufnr)
  if not client then
    vim.notify('Ditto: no running ditto-lsp client (see :checkhealth ditto)', vim.log.levels.WARN)
    return
  end
  client:request(method, params, function(err, result)
    if err then
      vim.notify(('Ditto: %s failed: %s'):format(method, err.message or vim.inspect(err)), vim.log.levels.ERROR)
      return
    end
    on_result(result)
  end, bufnr)
end

--- :DittoStats: requests, cancellations, latency percentiles, acceptance rate, tokens per pass.
function M.stats()
  request('ditto/stats', {}, function(result)
    M.scratch('ditto://stats', render(result), 'lua')
  end)
end

--- :DittoTrace: the propose/verify rounds of the last completion in the current buffer.
function M.trace()
  local uri = vim.uri_from_bufnr(vim.api.nvim_get_current_buf())
  request('ditto/trace', { uri = uri }, function(result)
    if result == nil or result == vim.NIL then
      vim.notify('Ditto: no completion traced in this buffer yet')
      return
    end
    M.scratch('ditto://trace', render(result), 'lua')
  end)
end

--- :DittoToggle: suggestions on or off in the current buffer.
function M.toggle()
  local bufnr = vim.api.nvim_get_current_buf()
  if M.mode() == 'inline_completion' then
    local on = not vim.lsp.inline_completion.is_enabled({ bufnr = bufnr })
    vim.lsp.inline_completion.enable(on, { bufnr = bufnr })
    vim.notify('Ditto: suggestions ' .. (on and 'on' or 'off'))
  else
    local client = M.client(bufnr)
    if client then
      local on = vim.b[bufnr].ditto_off == true
      vim.b[bufnr].ditto_off = not on
      vim.lsp.completion.enable(on, client.id, bufnr, { autotrigger = true, convert = convert })
      vim.notify('Ditto: suggestions ' .. (on and 'on' or 'off'))
    end
  end
end

function M.create_commands()
  local cmd = vim.api.nvim_create_user_command
  cmd('DittoStats', M.stats, { desc = 'Ditto: server statistics (ditto/stats)' })
  cmd('DittoTrace', M.trace, { desc = "Ditto: the last completion's propose/verify rounds (ditto/trace)" })
  cmd('DittoToggle', M.toggle, { desc = 'Ditto: suggestions on/off in this buffer' })
end

---@param opts? ditto.Opts
function M.setup(opts)
  opts = opts or {}
  M.opts = vim.tbl_deep_extend('force', vim.deepcopy(M.defaults), opts)
  if opts.keymaps == false then
    M.opts.keymaps = false
  end

  local config = {} ---@type vim.lsp.Config
  if opts.cmd then
    config.cmd = opts.cmd
  end
  if opts.filetypes then
    config.filetypes = opts.filetypes
  end
  local init = vim.tbl_extend('force', {}, opts.init_options or {})
  for _, key in ipairs(M.server_options) do
    if opts[key] ~= nil then
      init[key] = opts[key]
    end
  end
  for key in pairs(opts) do
    if not client_options[key] and not vim.tbl_contains(M.server_options, key) then
      vim.notify(('Ditto: unknown setup() option %q (ignored)'):format(key), vim.log.levels.WARN)
    end
  end
  if next(init) then
    config.init_options = init
  end
  vim.lsp.config(M.name, config)

  local group = vim.api.nvim_create_augroup('ditto', { clear = true })
  vim.api.nvim_create_autocmd('LspAttach', {
    group = group,
    callback = function(args)
      local client = vim.lsp.get_client_by_id(args.data.client_id)
      if client and client.name == M.name then
        M.attach(client, args.buf)
      end
    end,
  })
  M.create_commands()
  if M.opts.enable then
    vim.lsp.enable(M.name)
  end
end

return M
