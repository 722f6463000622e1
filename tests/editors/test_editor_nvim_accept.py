"""Accepting part of the ghost text in the Neovim plugin as shipped (editors/nvim/lua/ditto/partial.lua,
keys `accept_word` <C-Right> and `accept_line` <C-Down> of `setup({keymaps = ...})`), Neovim 0.12-dev
headless:

- against `ditto-lsp serve --model tiny-random`: <C-Right> inserts the next word of the suggestion
  shown, the rest of it is shown again at once (answered by the server's type-through, no model
  call), <C-Down> inserts the rest of its line; the buffer the user ends with is checked;
- against a small server written in Lua inside the same Neovim (a fixed two-line suggestion, and the
  type-through a server does: the rest of it for a cursor that typed its start), so that a word and
  a line are cut from a suggestion of several lines: words, the line's rest, then the line break with
  the next line.

The expected buffer is computed here, from what the editor showed and the rule the README states
(`word`, `line` below), never from the plugin's own functions. Skips with the reason when Neovim 0.12
or the server command is absent (editors/install.sh installs the editors).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.editors.test_editor_nvim_plugin import (DRIVER_PRELUDE, EXAMPLE, NVIM_012, README_INIT, ROOT,
                                                   end_of_line_candidates, headless, require, require_serve, shown)

pytestmark = pytest.mark.editor

_BLANK = " \t\n\v\f\r"  # Lua's %s
_WORD = r"0-9A-Za-z_\u0080-\U0010ffff"  # Lua's %w and _, and every non-ASCII character (its bytes >= 0x80)


def word(rest: str) -> str:
    """The README's next word: blanks (line breaks too), then characters neither blank nor word
    characters, then word characters."""
    return re.match(f"[{_BLANK}]*[^{_WORD}{_BLANK}]*[{_WORD}]*", rest).group(0)


def line(rest: str) -> str:
    """The README's next line: the rest of the line, or at a line's end the line break and the next line."""
    return re.match(r"\n?[^\n]*", rest).group(0)


def test_the_rule_here_is_the_plugins(tmp_path):
    """`word` and `line` above against the plugin's own, on text with blanks, brackets, line breaks
    and non-ASCII words (so the editor tests below check the plugin against the rule the README states)."""
    require(NVIM_012)
    cases = ["foo(bar, baz)\n    return x", "(self, other)", "  \n    return x", ")\n", "^ ifname", '- han"\\,Y# "',
             "héllo wörld", " ", "\n\nfoo", "x=1;\ty = 2", "\t\tpass"]
    driver = DRIVER_PRELUDE + r"""
local p = require('ditto.partial')
report.cut = {}
for _, s in ipairs(vim.json.decode(vim.env.DITTO_TEST_CASES)) do
  table.insert(report.cut, { p.word(s), p.line(s) })
end
finish()
"""
    src = tmp_path / "empty.txt"
    src.write_text("", encoding="utf-8")
    init = f"vim.opt.runtimepath:prepend('{ROOT / 'editors' / 'nvim'}')\n"
    r = headless(NVIM_012, driver, init, src, tmp_path, "/bin/true", 60,
                 {"DITTO_TEST_MODE": "rule", "DITTO_TEST_CASES": json.dumps(cases)})
    assert r["cut"] == [[word(s), line(s)] for s in cases]
    assert [word(s) for s in cases[:4]] == ["foo", "(self", "  \n    return", ")"]
    assert [line(s) for s in cases[:4]] == ["foo(bar, baz)", "(self, other)", "  ", ")"]
    assert line("\n\nfoo") == "\n" and line("\n    return x\nmore") == "\n    return x"


# Runs inside Neovim: insert mode at the end of line $DITTO_TEST_LINE, then the accept_word key, then
# the accept_line key, each once the ghost text is shown. Records the ghost text shown before each key,
# the rest of the suggestion each key acted on (the plugin's `partial.insert` wrapped: the item it was
# given, read with the plugin's `rest`), the buffer after each key and the server's ditto/stats.
DRIVER = DRIVER_PRELUDE + r"""
local ns = vim.api.nvim_create_namespace('nvim.lsp.inline_completion')

-- The ghost text drawn (virtual text, then its virtual lines), its row; nil when none is drawn.
local function ghost()
  local m = vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true })[1]
  if not m then return nil end
  local out = { table.concat(vim.tbl_map(function(c) return c[1] end, m[4].virt_text or {})) }
  for _, vl in ipairs(m[4].virt_lines or {}) do
    out[#out + 1] = table.concat(vim.tbl_map(function(c) return c[1] end, vl))
  end
  return { text = table.concat(out, '\n'), row = m[2] }
end

local function main()
  local bufnr = vim.api.nvim_get_current_buf()
  local client = wait_for('the ditto client to attach', 30000, function()
    return vim.lsp.get_clients({ name = 'ditto', bufnr = bufnr })[1]
  end)
  wait_for('initialize', 30000, function() return client.initialized end)
  local partial = require('ditto.partial')
  local accepted = {}
  local insert = partial.insert
  partial.insert = function(item, kind, b)
    local c = vim.api.nvim_win_get_cursor(0)
    table.insert(accepted, { kind = kind, rest = partial.rest(item, b, c[1] - 1, c[2]) or vim.NIL })
    return insert(item, kind, b)
  end
  local stats = function()
    if vim.env.DITTO_TEST_STATS == '1' then return request(client, 'ditto/stats', {}) end
    return vim.NIL
  end
  if vim.env.DITTO_TEST_STATS == '1' then
    -- Insert mode once the model is ready: started while it loads, the plugin's re-ask on
    -- ditto/modelReady can come after the first key (tests/editors/test_editor_nvim_plugin.py tests that).
    local ditto, ready = require('ditto'), false
    local model_ready = ditto.model_ready
    ditto.model_ready = function(...)
      ready = true
      return model_ready(...)
    end
    if request(client, 'ditto/stats', {}).model_state ~= 'ready' then
      wait_for('the model to load', 300000, function() return ready end)
    end
  end
  local row = tonumber(vim.env.DITTO_TEST_LINE)
  report.before = lines()
  vim.api.nvim_win_set_cursor(0, { row, 0 })
  vim.api.nvim_input('A')
  report.steps = {}
  for i, key in ipairs({ vim.env.DITTO_TEST_KEY1, vim.env.DITTO_TEST_KEY2, vim.env.DITTO_TEST_KEY3 }) do
    if key == '' then break end
    local g = wait_for('ghost text before key ' .. i, 120000, function()
      local x = ghost()
      return vim.api.nvim_get_mode().mode == 'i' and x and x.text ~= '' and x or nil
    end)
    local step = { key = key, ghost = g.text, ghost_row = g.row, stats = stats() }
    local was = lines()
    vim.api.nvim_input(key)
    wait_for('key ' .. i .. ' to insert text', 10000, function()
      return #accepted == i and not vim.deep_equal(lines(), was)
    end)
    step.accepted = accepted[i]
    step.after = lines()
    step.cursor = vim.api.nvim_win_get_cursor(0)
    table.insert(report.steps, step)
  end
  if vim.env.DITTO_TEST_GHOST_AFTER == '1' then
    report.ghost_after = wait_for('the ghost text after the last key', 120000, function()
      local x = ghost()
      return x and x.text ~= '' and x or nil
    end).text
  end
  report.stats = stats()
  vim.api.nvim_input('<Esc>')
  wait_for('normal mode', 5000, function() return vim.api.nvim_get_mode().mode == 'n' end)
  report.after = lines()
end

co = coroutine.create(function()
  local ok, err = xpcall(main, debug.traceback)
  if not ok then report.error = err end
  finish()
end)
vim.schedule(function() assert(coroutine.resume(co)) end)
"""


def run(tmp_path: Path, init: str, keys: list[str], line_no: int, src: Path, exe: str, *, stats: bool = False,
        ghost_after: bool = False, env: dict[str, str] | None = None) -> dict:
    """The DRIVER in Neovim 0.12 on `src` with `init`: insert mode at the end of line `line_no`, then `keys`."""
    tmp_path.mkdir(exist_ok=True)
    keys = (keys + ["", "", ""])[:3]
    return headless(NVIM_012, DRIVER, init, src, tmp_path, exe, 200, {
        "DITTO_TEST_MODE": "accept", "DITTO_TEST_LINE": str(line_no), "DITTO_TEST_STATS": "1" if stats else "0",
        "DITTO_TEST_GHOST_AFTER": "1" if ghost_after else "0",
        "DITTO_TEST_KEY1": keys[0], "DITTO_TEST_KEY2": keys[1], "DITTO_TEST_KEY3": keys[2], **(env or {})})


def drawn(text: str) -> str:
    """How Neovim draws ghost text `text` (its lines joined by line breaks here)."""
    return "\n".join(shown(x) for x in text.split("\n"))


def with_inserted(lines: list[str], row: int, col: int, text: str) -> list[str]:
    """`lines` with `text` inserted at 0-based (row, byte column col)."""
    cur = lines[row].encode()
    new = (cur[:col].decode() + text + cur[col:].decode()).split("\n")
    return lines[:row] + new + lines[row + 1:]


def multiword_line(text: str, name: str) -> int | None:
    """The first end-of-line candidate where tiny-random's whole suggestion (the server's settings with
    `first_answer_s` null, as the test sets them) has a first line of more than one word: there the
    word key inserts a part and leaves a rest; None where there is none. `name`: the file's path as the
    server names it (it is in the prompt, so the suggestions depend on it)."""
    from lsp_server.settings import Settings
    from support.completers import like_the_server

    completer = like_the_server()
    rows = text.split("\n")
    for ln in end_of_line_candidates(text):
        sug = completer.complete(text, ln - 1, len(rows[ln - 1]), name=name,
                                 options=Settings(first_answer_s=None).decode_options())
        first = sug.text.split("\n")[0]
        if first.strip() and word(first) != first:
            return ln
    return None


# Folder names to try, unlike one another: the path is in the prompt, and names that differ only in a
# digit fail together (under `pytest-182/…`, project0..7 all gave no such line, `a`, `src`, `demo` did).
FOLDERS = ("project", "a", "src", "demo", "work0", "example", "x/y", "shapes", "lib", "app", "pkg", "b/c")


def multiword_project(tmp_path: Path, text: str, name: str) -> tuple[Path, int]:
    """A folder under `tmp_path` holding `text` as `name`, and a line of it where tiny-random's first line
    has several words. The path is in the prompt, and about one pytest temporary folder in sixty gives
    no such line at all (CI met one: `pytest-149`), so the folder's name is chosen here, not by pytest."""
    for folder in FOLDERS:
        work = tmp_path / folder
        work.mkdir(parents=True)
        src = work / name
        src.write_text(text, encoding="utf-8")
        line_no = multiword_line(text, str(src))
        if line_no is not None:
            return src, line_no
    raise AssertionError(f"tiny-random suggests no first line of several words at any candidate line, "
                         f"in any of {len(FOLDERS)} folders under {tmp_path}")


def test_nvim_012_accept_word_then_line_of_dittos_suggestion(tmp_path):
    """<C-Right> then <C-Down> on the server's ghost text: the next word, then the rest of its line;
    the rest after the word is shown again without a model call (type-through)."""
    require(NVIM_012)
    exe = require_serve()
    src, line_no = multiword_project(tmp_path, EXAMPLE.read_text(encoding="utf-8"), "shapes.py")
    # first_answer_s = vim.NIL: the whole suggestion is the first answer, however slow this machine is
    # now (the deadline's partial first answers are the server's own tests' business).
    init = README_INIT.replace("~/src/ditto", str(ROOT)).replace(
        "model = 'default',", "model = 'tiny-random', first_answer_s = vim.NIL,")
    r = run(tmp_path, init, ["<C-Right>", "<C-Down>"], line_no, src, exe, stats=True)
    before = r["before"]
    row, col = line_no - 1, len(before[line_no - 1].encode())
    w, ln = r["steps"]
    # the word key acted on the suggestion shown, and inserted its next word, only that
    rest = w["accepted"]["rest"]
    assert w["accepted"]["kind"] == "word" and w["ghost"] == drawn(rest)
    part = word(rest)
    assert part and part != rest, rest  # (multiword_line chose a line where it is a part)
    assert w["after"] == with_inserted(before, row, col, part)
    # the rest of the same suggestion is shown again, answered without the model
    rest2 = ln["accepted"]["rest"]
    assert ln["ghost"] == drawn(rest2) and rest2 == rest[len(part):], (rest, rest2)
    done = ln["stats"]["typethrough"] - w["stats"]["typethrough"]
    assert done >= 1, (w["stats"], ln["stats"])
    # the line key: the rest of the line, and that is the buffer the user ends with
    assert ln["accepted"]["kind"] == "line"
    assert ln["after"] == with_inserted(before, row, col, part + line(rest2))
    assert r["after"] == ln["after"]


# A language server inside Neovim (vim.lsp.start with a Lua `cmd`): one suggestion, SUGGESTION, for the
# place where insert mode starts, and for a cursor further on whose text since that place is the
# suggestion's start, the rest of it (what Ditto's type-through answers). Full document sync.
FAKE_SERVER = r"""
local SUGGESTION = vim.env.DITTO_TEST_SUGGESTION
local function fake(dispatchers)
  local text, anchor = '', nil
  local closing, id = false, 0
  local function offset(pos)
    local ls = vim.split(text, '\n', { plain = true })
    local o = 0
    for i = 1, pos.line do o = o + #ls[i] + 1 end
    return o + pos.character  -- (the test's text is ASCII: UTF-16 units are bytes)
  end
  return {
    request = function(method, params, callback)
      local result = nil  -- (JSON null reaches a handler as nil)
      if method == 'initialize' then
        result = { capabilities = { textDocumentSync = 1, inlineCompletionProvider = true } }
      elseif method == 'textDocument/inlineCompletion' then
        local at = offset(params.position)
        anchor = anchor or at
        local typed = text:sub(anchor + 1, at)
        if at >= anchor and SUGGESTION:sub(1, #typed) == typed and #typed < #SUGGESTION then
          result = { items = { { insertText = SUGGESTION:sub(#typed + 1),
                                 range = { start = params.position, ['end'] = params.position } } } }
        end
      end
      id = id + 1
      vim.schedule(function() callback(nil, result) end)
      return true, id
    end,
    notify = function(method, params)
      if method == 'textDocument/didOpen' then text = params.textDocument.text end
      if method == 'textDocument/didChange' then text = params.contentChanges[#params.contentChanges].text end
      return true
    end,
    is_closing = function() return closing end,
    terminate = function() closing = true end,
  }
end
"""


def test_nvim_012_accept_words_and_lines_across_the_lines_of_a_suggestion(tmp_path):
    """A two-line suggestion from a server inside Neovim: <C-Right>, <C-Right> insert its first words,
    <C-Down> the rest of its first line, <C-Down> the line break and its second line; the suggestion's
    rest is shown after each."""
    require(NVIM_012)
    suggestion = "total(self, other)\n    return self.area"
    src = tmp_path / "calc.py"
    src.write_text("def f(self, other):\n    x = \n", encoding="utf-8")
    init = FAKE_SERVER + README_INIT.replace("~/src/ditto", str(ROOT)).replace("model = 'default',", "cmd = fake,")
    keys = ["<C-Right>", "<C-Right>", "<C-Down>"]
    env = {"DITTO_TEST_SUGGESTION": suggestion}
    r = run(tmp_path, init, keys, 2, src, "/bin/true", ghost_after=True, env=env)
    before = r["before"]
    row, col = 1, len(before[1])
    done = ""
    for step, key in zip(r["steps"], keys):
        rest = suggestion[len(done):]
        assert step["accepted"]["rest"] == rest and step["ghost"] == rest  # what was shown is what the key took
        done += word(rest) if key == "<C-Right>" else line(rest)
        assert step["after"] == with_inserted(before, row, col, done), step
    assert done == "total(self, other)"
    assert r["ghost_after"] == "\n    return self.area"  # the line break and the next line still to come
    # then <C-Down> once more, at the line's end: the line break and the next line
    r2 = run(tmp_path / "again", init, ["<C-Down>", "<C-Down>"], 2, src, "/bin/true", env=env)
    assert [s["accepted"]["rest"] for s in r2["steps"]] == [suggestion, suggestion[len("total(self, other)"):]]
    assert r2["after"] == with_inserted(before, row, col, suggestion)
