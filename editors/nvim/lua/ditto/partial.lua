--- Accept part of the ghost text (Neovim 0.12's vim.lsp.inline_completion): its next word or the rest
--- of its line. The part is inserted at the cursor like typed text; vim.lsp.inline_completion then asks
--- again at the new cursor (it does on every CursorMovedI), and the server answers at once with the rest
--- of the same suggestion, without a model call (its type-through: the text after the cursor unchanged,
--- the text before it the old text plus the start of the suggestion). A part that is the whole rest, an
--- item that replaces text after the cursor (a next edit on the cursor's line) and a snippet are
--- accepted whole, as the accept key does. Left out: which suggestion is shown (the server decides).
local M = {}

--- The next word of `rest` (the ghost text after the cursor): its blanks (line breaks too), then
--- the characters that are neither blank nor word characters, then the word characters (ASCII
--- letters, digits, `_`, and every non-ASCII character). Never empty for a non-empty `rest`.
---@param rest string
---@return string
function M.word(rest)
  local blank = rest:match('^%s*')
  local punct = rest:match('^[^%w_%s\128-\255]*', #blank + 1)
  local word = rest:match('^[%w_\128-\255]*', #blank + #punct + 1)
  return blank .. punct .. word
end

--- The next line of `rest`: up to its first line break (not included), or, where `rest` starts
--- with a line break (the cursor at the end of a line of the suggestion), that line break and the
--- line after it. The cursor then ends at the end of an accepted line, never on an empty new one.
---@param rest string
---@return string
function M.line(rest)
  return rest:match('^\n?[^\n]*')
end

--- What Neovim's own accept does with `item` (vim.lsp.inline_completion's Completor:accept).
---@param item vim.lsp.inline_completion.Item
---@param bufnr integer
local function accept_whole(item, bufnr)
  local text = item.insert_text
  if type(text) == 'string' then
    local range = item.range
    if range then
      local lines = vim.split(text, '\n', { plain = true })
      vim.api.nvim_buf_set_text(bufnr, range.start.row, range.start.col, range.end_.row, range.end_.col, lines)
      local pos = range.start:to_cursor()
      vim.api.nvim_win_set_cursor(vim.fn.bufwinid(bufnr),
        { pos[1] + #lines - 1, (#lines == 1 and pos[2] or 0) + #lines[#lines] })
    else
      vim.api.nvim_paste(text, false, 0)
    end
  elseif text.kind == 'snippet' then
    vim.snippet.expand(text.value)
  end
  if item.command then
    local client = vim.lsp.get_client_by_id(item.client_id)
    if client then
      client:exec_cmd(item.command, { bufnr = bufnr })
    end
  end
end

--- The ghost text of `item` after the cursor (row, col: 0-based, bytes), or nil where the item is not
--- text inserted at the cursor: a snippet, or a range that replaces text after the cursor or whose
--- text before the cursor is not the start of the item's text.
---@param item vim.lsp.inline_completion.Item
---@param bufnr integer
---@param row integer
---@param col integer
---@return string?
function M.rest(item, bufnr, row, col)
  local text = item.insert_text
  if type(text) ~= 'string' then
    return nil
  end
  local range = item.range
  if not range then
    return text
  end
  local s, e = range.start, range.end_
  if e.row ~= row or e.col ~= col or s.row > row or (s.row == row and s.col > col) then
    return nil
  end
  local typed = table.concat(vim.api.nvim_buf_get_text(bufnr, s.row, s.col, row, col, {}), '\n')
  if text:sub(1, #typed) ~= typed then
    return nil
  end
  return text:sub(#typed + 1)
end

--- Insert the `kind` part ('word' | 'line') of `item`'s ghost text at the cursor, or the whole item
--- (see the module's comment).
---@param item vim.lsp.inline_completion.Item
---@param kind 'word'|'line'
---@param bufnr integer
function M.insert(item, kind, bufnr)
  local win = vim.fn.bufwinid(bufnr)
  local cursor = vim.api.nvim_win_get_cursor(win)
  local row, col = cursor[1] - 1, cursor[2]
  local rest = M.rest(item, bufnr, row, col)
  local part = rest and M[kind](rest)
  if not part or part == rest then
    return accept_whole(item, bufnr)
  end
  local lines = vim.split(part, '\n', { plain = true })
  vim.api.nvim_buf_set_text(bufnr, row, col, row, col, lines)
  vim.api.nvim_win_set_cursor(win, { row + #lines, (#lines == 1 and col or 0) + #lines[#lines] })
end

--- Accept the `kind` part of the ghost text shown in `bufnr` (default: the current buffer).
---@param kind 'word'|'line'
---@param bufnr? integer
---@return boolean shown whether ghost text was shown (false: nothing done)
function M.accept(kind, bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  return vim.lsp.inline_completion.get({
    bufnr = bufnr,
    on_accept = function(item)
      M.insert(item, kind, bufnr)
    end,
  })
end

return M
