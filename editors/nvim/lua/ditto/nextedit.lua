--- Ditto's next-edit suggestions in Neovim: after an edit, once you pause, ask the server
--- (`ditto/nextEdit`, lsp_server/lsp/nextedit.py) for the edit that follows, often somewhere else,
--- and show it where it goes: the text it replaces struck through, the new text after it (virtual
--- text), a sign in the gutter, and a hint at the cursor when the place is off screen. The first
--- <Tab> jumps the cursor there, the second applies it (one nvim_buf_set_text) and puts the cursor
--- where the server says; <Esc> dismisses it. Nothing is applied without that key, and <Tab> keeps its
--- meaning when no edit is shown (ghost text, accepted by init.lua's mapping, comes first).
---
--- A proposal is dropped when it answers a buffer version that is no longer current, and any edit
--- clears the one shown. No request is made while ghost text (vim.lsp.inline_completion) or the
--- completion menu is shown. Left out: what is proposed (the server decides) and ghost text itself.
local M = {}

M.debounce_ms = 300
M.ns = vim.api.nvim_create_namespace('ditto.next_edit')
local inline_ns = vim.api.nvim_create_namespace('nvim.lsp.inline_completion')

--- Per attached buffer: { client, timer, asked (the changedtick last asked about), seq }.
local buffers = {}
--- The proposal shown (at most one): { bufnr (asked from), target (buffer it edits), tick,
--- result (the server's answer), row, col, end_row, end_col (byte positions in target) }.
M.current = nil
--- What happened, for tests and :DittoStats-like inspection.
M.counts = { asked = 0, shown = 0, stale = 0, none = 0, jumped = 0, applied = 0, dismissed = 0, cleared = 0 }

local function set_highlights()
  local hl = vim.api.nvim_set_hl
  hl(0, 'DittoNextEditOld', { default = true, strikethrough = true })
  hl(0, 'DittoNextEditNew', { default = true, link = 'DiffAdd' })
  hl(0, 'DittoNextEditSign', { default = true, link = 'DiagnosticHint' })
  hl(0, 'DittoNextEditHint', { default = true, link = 'Comment' })
end

local function ghost_shown(bufnr)
  return #vim.api.nvim_buf_get_extmarks(bufnr, inline_ns, 0, -1, { limit = 1 }) > 0
end

--- Byte column of `character` (in the client's `encoding`) on `row` of `bufnr`, or nil past its end.
local function byte_col(bufnr, row, character, encoding)
  local line = vim.api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1]
  if line == nil then
    return nil
  end
  local ok, col = pcall(vim.str_byteindex, line, encoding, character, false)
  return ok and col or nil
end

local function text_of(bufnr, row, col, end_row, end_col)
  return table.concat(vim.api.nvim_buf_get_text(bufnr, row, col, end_row, end_col, {}), '\n')
end

--- Remove the marks of proposal `cur`.
local function erase(cur)
  for _, b in ipairs({ cur.bufnr, cur.target, cur.hint_buf }) do
    if vim.api.nvim_buf_is_valid(b) then
      vim.api.nvim_buf_clear_namespace(b, M.ns, 0, -1)
    end
  end
end

--- Remove the shown proposal (if any); `why` counts it.
function M.clear(why)
  local cur = M.current
  if not cur then
    return
  end
  M.current = nil
  erase(cur)
  if why then
    M.counts[why] = (M.counts[why] or 0) + 1
  end
end

--- Whether a proposal is shown for `bufnr` (asked from it, or editing it).
function M.shown(bufnr)
  local cur = M.current
  return cur ~= nil and (bufnr == nil or cur.bufnr == bufnr or cur.target == bufnr)
end

--- Draw the shown proposal: struck-through old text, the new text after it, a sign, and a hint at
--- the cursor when its place is not on screen in the current window.
function M.render()
  local cur = M.current
  if not cur then
    return
  end
  erase(cur)
  cur.hint_buf = nil
  local t, r = cur.target, cur.result
  if cur.end_row > cur.row or cur.end_col > cur.col then
    vim.api.nvim_buf_set_extmark(t, M.ns, cur.row, cur.col, {
      end_row = cur.end_row, end_col = cur.end_col, hl_group = 'DittoNextEditOld', priority = 200,
    })
  end
  local new = vim.split(r.newText, '\n', { plain = true })
  local virt_lines = {}
  for i = 2, #new do
    virt_lines[#virt_lines + 1] = { { new[i], 'DittoNextEditNew' } }
  end
  vim.api.nvim_buf_set_extmark(t, M.ns, cur.end_row, cur.end_col, {
    virt_text = new[1] ~= '' and { { new[1], 'DittoNextEditNew' } } or nil,
    virt_text_pos = 'inline',
    virt_lines = #virt_lines > 0 and virt_lines or nil,
    sign_text = '»',
    sign_hl_group = 'DittoNextEditSign',
    priority = 200,
  })
  local win = vim.api.nvim_get_current_win()
  local here = vim.api.nvim_win_get_buf(win)
  local top, bottom = vim.fn.line('w0', win) - 1, vim.fn.line('w$', win) - 1
  if here ~= t or cur.row < top or cur.row > bottom then
    local row = vim.api.nvim_win_get_cursor(win)[1] - 1
    local where = here ~= t and vim.fn.fnamemodify(vim.api.nvim_buf_get_name(t), ':t') .. ':' or 'line '
    cur.hint_buf = here
    vim.api.nvim_buf_set_extmark(here, M.ns, row, 0, {
      virt_text = { { ('  » next edit at %s%d (Tab)'):format(where, cur.row + 1), 'DittoNextEditHint' } },
      virt_text_pos = 'eol',
    })
  end
end

--- The server's answer to a request made at changedtick `tick` of `bufnr`: shown if still current.
function M.on_result(client, bufnr, tick, result)
  if result == nil or result == vim.NIL then
    M.counts.none = M.counts.none + 1
    return
  end
  -- (`version` is null for an edit in another document: the changedtick and its text tell then)
  local version = result.version ~= vim.NIL and result.version or nil
  if not vim.api.nvim_buf_is_valid(bufnr) or vim.b[bufnr].changedtick ~= tick
    or (version ~= nil and version ~= vim.lsp.util.buf_versions[bufnr]) then
    M.counts.stale = M.counts.stale + 1
    return
  end
  local target  -- a loaded buffer (vim.uri_to_bufnr would add one)
  for _, b in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_is_loaded(b) and vim.uri_from_bufnr(b) == result.uri then
      target = b
      break
    end
  end
  if not target then
    M.counts.stale = M.counts.stale + 1
    return
  end
  local enc = client.offset_encoding or 'utf-16'
  local s, e = result.range.start, result.range['end']
  local col, end_col = byte_col(target, s.line, s.character, enc), byte_col(target, e.line, e.character, enc)
  if not col or not end_col or text_of(target, s.line, col, e.line, end_col) ~= result.oldText then
    M.counts.stale = M.counts.stale + 1  -- the other buffer changed meanwhile
    return
  end
  if ghost_shown(bufnr) then
    return  -- ghost text came meanwhile: it keeps the key
  end
  M.clear()
  M.current = {
    bufnr = bufnr, target = target, tick = tick, target_tick = vim.b[target].changedtick, result = result,
    encoding = enc, row = s.line, col = col, end_row = e.line, end_col = end_col,
  }
  M.counts.shown = M.counts.shown + 1
  M.render()
end

--- Ask now for `bufnr` (the timer calls this after the pause), unless asked at this changedtick
--- already, or ghost text or the completion menu is shown.
function M.ask(bufnr)
  local b = buffers[bufnr]
  if not b or b.client:is_stopped() or not vim.api.nvim_buf_is_valid(bufnr) then
    return
  end
  if vim.api.nvim_get_current_buf() ~= bufnr or ghost_shown(bufnr) or vim.fn.pumvisible() == 1 then
    return
  end
  local tick = vim.b[bufnr].changedtick
  if b.asked == tick or M.shown() then
    return
  end
  b.asked = tick
  b.seq = b.seq + 1
  local seq = b.seq
  M.counts.asked = M.counts.asked + 1
  local params = vim.lsp.util.make_position_params(0, b.client.offset_encoding)
  b.client:request('ditto/nextEdit', params, function(err, result)
    if err or b.seq ~= seq then
      return  -- an error (the server logs it) or a newer request: newest wins
    end
    M.on_result(b.client, bufnr, tick, result)
  end, bufnr)
end

local function schedule(bufnr)
  local b = buffers[bufnr]
  if not b then
    return
  end
  b.timer:stop()
  b.timer:start(M.debounce_ms, 0, vim.schedule_wrap(function()
    M.ask(bufnr)
  end))
end

--- <Tab>: jump to the shown edit, or apply it when the cursor is at its start already.
function M.tab()
  local cur = M.current
  if not cur then
    return
  end
  local t = cur.target
  if vim.b[t].changedtick ~= cur.target_tick then
    M.clear('cleared')
    return
  end
  local win = vim.api.nvim_get_current_win()
  local pos = vim.api.nvim_win_get_cursor(win)
  -- At the place: where the jump put the cursor (normal mode keeps it on the line's last character,
  -- so a place at a line's end is one column past where the cursor can stand).
  local landed = cur.landed
  local here = pos[1] - 1 == cur.row and (pos[2] == cur.col or (landed ~= nil and pos[2] == landed[2]))
  if vim.api.nvim_win_get_buf(win) ~= t or not here then
    local shown_in = vim.fn.win_findbuf(t)[1]
    if vim.api.nvim_win_get_buf(win) ~= t then
      if shown_in then
        vim.api.nvim_set_current_win(shown_in)
      else
        vim.api.nvim_win_set_buf(win, t)
      end
      win = vim.api.nvim_get_current_win()
    end
    vim.cmd("normal! m'")  -- the place left is on the jumplist (<C-o> goes back)
    vim.api.nvim_win_set_cursor(win, { cur.row + 1, cur.col })
    cur.landed = vim.api.nvim_win_get_cursor(win)
    M.counts.jumped = M.counts.jumped + 1
    M.render()
    return
  end
  M.apply()
end

--- Apply the shown edit (one nvim_buf_set_text) and put the cursor where the server says.
function M.apply()
  local cur = M.current
  if not cur then
    return
  end
  local t, r = cur.target, cur.result
  if vim.b[t].changedtick ~= cur.target_tick
    or text_of(t, cur.row, cur.col, cur.end_row, cur.end_col) ~= r.oldText then
    M.clear('cleared')
    return
  end
  M.clear()
  vim.api.nvim_buf_set_text(t, cur.row, cur.col, cur.end_row, cur.end_col, vim.split(r.newText, '\n', { plain = true }))
  M.counts.applied = M.counts.applied + 1
  local c = r.cursor
  local col = byte_col(t, c.line, c.character, cur.encoding)
  if col and vim.api.nvim_get_current_buf() == t then
    vim.api.nvim_win_set_cursor(0, { c.line + 1, col })
  end
end

function M.dismiss()
  M.clear('dismissed')
end

--- Start asking for next edits in `bufnr` (attached to `client`).
---@param client vim.lsp.Client
---@param bufnr integer
function M.attach(client, bufnr)
  set_highlights()
  if buffers[bufnr] then
    buffers[bufnr].client = client
    return
  end
  local b = { client = client, timer = assert(vim.uv.new_timer()), asked = vim.b[bufnr].changedtick, seq = 0 }
  buffers[bufnr] = b
  local group = vim.api.nvim_create_augroup(('ditto.next_edit:%d'):format(bufnr), { clear = true })
  -- Any edit clears the shown proposal, at once (on_lines runs at the change itself, before the
  -- next key is read: <Esc> or <Tab> typed right after it no longer see the proposal).
  vim.api.nvim_buf_attach(bufnr, false, {
    on_lines = function(_, buf)
      if buffers[bufnr] ~= b then
        return true  -- detached
      end
      local cur = M.current
      if cur and (cur.bufnr == buf or cur.target == buf) then
        M.current = nil
        M.counts.cleared = M.counts.cleared + 1
        vim.schedule(function()  -- no extmark changes inside on_lines
          erase(cur)
          M.render()  -- a proposal shown meanwhile (none, mostly)
        end)
      end
    end,
  })
  vim.api.nvim_create_autocmd({ 'TextChanged', 'TextChangedI', 'TextChangedP' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      schedule(bufnr)
    end,
  })
  vim.api.nvim_create_autocmd('InsertLeave', {
    group = group,
    buffer = bufnr,
    callback = function()
      schedule(bufnr)  -- asked nothing while ghost text was shown: ask now (if the text changed)
    end,
  })
  vim.api.nvim_create_autocmd({ 'WinScrolled', 'CursorMoved', 'CursorMovedI', 'BufEnter' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      if M.shown() then
        M.render()
      end
    end,
  })
  vim.api.nvim_create_autocmd({ 'BufUnload', 'LspDetach' }, {
    group = group,
    buffer = bufnr,
    callback = function(args)
      if args.event == 'BufUnload' or (args.data and args.data.client_id == b.client.id) then
        M.detach(bufnr)
      end
    end,
  })
end

function M.detach(bufnr)
  local b = buffers[bufnr]
  if not b then
    return
  end
  buffers[bufnr] = nil
  b.timer:stop()
  if not b.timer:is_closing() then
    b.timer:close()
  end
  if M.shown(bufnr) then
    M.clear()
  end
  pcall(vim.api.nvim_del_augroup_by_name, ('ditto.next_edit:%d'):format(bufnr))
end

--- The keys' expressions (init.lua maps them): what <Tab> / <Esc> do while an edit is shown, or
--- nil to let the key keep its meaning.
function M.tab_keys()
  if M.shown() and vim.fn.pumvisible() == 0 then  -- the completion menu keeps its keys
    return '<Cmd>lua require("ditto.nextedit").tab()<CR>'
  end
end

function M.dismiss_keys()
  if M.shown() then
    return '<Cmd>lua require("ditto.nextedit").dismiss()<CR>'
  end
end

return M
