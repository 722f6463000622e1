"""Next-edit suggestions in the Neovim plugin as shipped (editors/nvim/lua/ditto/nextedit.lua, set up
as the README says), driven headless against `ditto-lsp serve --model tiny-random` (the proposer,
edit propagation, needs no model):

- a rename typed at one place (`ciw` + the new name) is followed, once the user pauses, by the
  proposal at the next place: the replaced text struck through, the new text after it, a sign in
  the gutter and, the place being off screen, a hint at the cursor; <Tab> jumps there, a second
  <Tab> applies the server's edit and puts the cursor where the server says;
- <Esc> dismisses it: the marks go, nothing changes, and <Tab> is <Tab> (Vim's jump) again;
- with `next_edit = false` nothing is set up to ask (the module is not loaded, no key is mapped);
- lines inserted in one of two calls whose lines around them are the same are proposed in the other,
  drawn as a new line below the line above (no text on that line), and <Tab>, <Tab> insert them: the
  first lands on that line's last character, where normal mode puts a cursor sent to its end;
- where the rename applies again on the line being typed, the server's inline completion item
  (Neovim 0.12's vim.lsp.inline_completion) shows the rest of the line renamed over the old text,
  and the accept key makes that edit.

The expected buffer is the file with the server's own answer (recorded in the editor) applied, so
the test never checks against a made-up edit. Each test skips with the reason when its editor or the
server command is absent (editors/install.sh installs the editors).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.nextedit.test_propagate import CALLS  # two calls whose lines around the inserted one are the same
from tests.editors.test_editor_nvim_plugin import (DRIVER_PRELUDE, NVIM_011, NVIM_012, README_INIT, ROOT, headless,
                                                   require, require_serve)

pytestmark = pytest.mark.editor

# A class renamed at its definition; its uses come after enough lines that the first is off screen
# (a headless Neovim's window has 23 lines).
FILLER = "".join(f"# line {i} of a comment that stands between the class and its uses\n" for i in range(30))
SOURCE = f'''class KeepOpenFile:
    """A file that stays open."""


{FILLER}
def open_stream(path):
    stream = KeepOpenFile(path)
    return stream


def other(path):
    handle = KeepOpenFile(path)
    return handle
'''

DRIVER = DRIVER_PRELUDE + r"""
-- mode: 'apply' | 'dismiss' | 'edit' | 'ghost' | 'other' | 'off' | 'inline'
local function cursor() return vim.api.nvim_win_get_cursor(0) end


-- Record the server's next-edit answers as they reach the client (the plugin is not touched).
local answers = {}
local function instrument(client)
  local orig = client.request
  client.request = function(self, method, params, handler, bufnr)
    if handler and method == 'ditto/nextEdit' then
      local h = handler
      handler = function(err, result, ...)
        table.insert(answers, { err = err, result = result or vim.NIL, version = vim.lsp.util.buf_versions[bufnr] })
        return h(err, result, ...)
      end
    end
    return orig(self, method, params, handler, bufnr)
  end
end

local function marks()
  local ns = vim.api.nvim_get_namespaces()['ditto.next_edit']
  if not ns then return {} end
  return vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true })
end

local function main()
  local bufnr = vim.api.nvim_get_current_buf()
  local client = wait_for('the ditto client to attach', 30000, function()
    return vim.lsp.get_clients({ name = 'ditto', bufnr = bufnr })[1]
  end)
  wait_for('initialize', 30000, function() return client.initialized end)
  instrument(client)
  report.feature = require('ditto').mode()
  if mode == 'other' then
    -- A second file open (and attached) in a hidden buffer: the rename's next place is there.
    vim.cmd('edit ' .. vim.fn.fnameescape(vim.env.DITTO_TEST_OTHER))
    local other = vim.api.nvim_get_current_buf()
    wait_for('the client to attach to the other file', 30000, function()
      return vim.lsp.get_clients({ name = 'ditto', bufnr = other })[1]
    end)
    report.other_before = lines()
    vim.cmd('buffer ' .. bufnr)
  end
  if mode == 'inline' then
    -- Rename the first of two uses on one line, staying in insert mode: the server's inline item
    -- makes the same change at the second, shown over the old text.
    local row = tonumber(vim.env.DITTO_TEST_GHOST_LINE)
    vim.api.nvim_win_set_cursor(0, { row, lines()[row]:find('KeepOpenFile', 1, true) - 1 })
    report.before = lines()
    vim.api.nvim_input('ciwKeepClosedFile')
    local shown = wait_for('the inline item over the old text', 30000, function()
      local gns = vim.api.nvim_get_namespaces()['nvim.lsp.inline_completion']
      for _, m in ipairs(gns and vim.api.nvim_buf_get_extmarks(0, gns, 0, -1, { details = true }) or {}) do
        local virt = m[4].virt_text and m[4].virt_text[1] and m[4].virt_text[1][1]
        if virt and virt:find('Closed', 1, true) then return m end
      end
    end)
    report.typed = lines()[row]
    report.cursor_typed = cursor()
    report.shown = { row = shown[2], col = shown[3], text = shown[4].virt_text[1][1], pos = shown[4].virt_text_pos }
    vim.api.nvim_input('<Tab>')
    wait_for('the item to be accepted', 10000, function() return lines()[row] ~= report.typed end)
    report.accepted_line = lines()[row]
    vim.api.nvim_input('<Esc>')
    wait_for('normal mode', 5000, function() return vim.api.nvim_get_mode().mode == 'n' end)
    report.after = lines()
    report.stats = request(client, 'ditto/stats', {})
    return
  end
  if mode == 'insert' then
    -- A keyword argument added on a line of its own, below line DITTO_TEST_GHOST_LINE, in the first
    -- of two calls whose lines around it are the same.
    local row = tonumber(vim.env.DITTO_TEST_GHOST_LINE)
    vim.api.nvim_buf_set_lines(0, row, row, true, { '        strict=True,' })
    vim.api.nvim_win_set_cursor(0, { row + 1, 0 })
  else
    -- Type the rename at the class's definition: the name changed word-wise, as a user does.
    vim.api.nvim_win_set_cursor(0, { 1, 6 })
    vim.api.nvim_input('ciwLazyFile<Esc>')
    wait_for('normal mode after the rename', 5000, function()
      return vim.api.nvim_get_mode().mode == 'n' and lines()[1] == 'class LazyFile:'
    end)
  end
  report.before = lines()
  report.cursor_before = cursor()
  if mode == 'off' then
    -- Nothing is set up to ask: the module is never loaded, <Tab> and <Esc> are Vim's own.
    report.loaded = package.loaded['ditto.nextedit'] ~= nil
    report.maps = { vim.fn.maparg('<Tab>', 'n'), vim.fn.maparg('<Esc>', 'n'), vim.fn.maparg('<Esc>', 'i') }
    report.stats = request(client, 'ditto/stats', {})
    return
  end
  local ne = require('ditto.nextedit')
  local shown = wait_for('the next edit to show', 30000, function()
    local m = marks()
    return ne.current and #m > 0 and m or nil
  end)
  report.answer = answers[#answers]
  report.answers = #answers
  report.marks = {}
  for _, m in ipairs(shown) do
    local d = m[4]
    local virt, below = {}, {}
    for _, chunk in ipairs(d.virt_text or {}) do virt[#virt + 1] = chunk[1] end
    for _, vl in ipairs(d.virt_lines or {}) do
      below[#below + 1] = table.concat(vim.tbl_map(function(chunk) return chunk[1] end, vl))
    end
    table.insert(report.marks, {
      row = m[2], col = m[3], end_row = d.end_row, end_col = d.end_col, hl_group = d.hl_group,
      virt_text = table.concat(virt), virt_text_pos = d.virt_text_pos, sign_text = d.sign_text,
      virt_lines = below,
    })
  end
  if mode == 'dismiss' then
    vim.api.nvim_input('<Esc>')
    wait_for('the marks to go', 5000, function() return #marks() == 0 and not ne.current end)
    report.after_dismiss = lines()
    vim.api.nvim_input('<Tab>')  -- nothing shown: Vim's own <Tab> (<C-i>, the jumplist), no edit
    report.after = lines()
    report.cursor_after = cursor()
    report.counts = vim.deepcopy(ne.counts)
    report.stats = request(client, 'ditto/stats', {})
    return
  end
  if mode == 'other' then
    report.hint = shown[1][4].virt_text and shown[1][4].virt_text[1][1]
    vim.api.nvim_input('<Tab>')
    wait_for('the other file', 5000, function() return vim.api.nvim_buf_get_name(0) == vim.env.DITTO_TEST_OTHER end)
    report.cursor_jumped = cursor()
    report.other_jumped = lines()
    vim.api.nvim_input('<Tab>')
    wait_for('the edit to apply', 5000, function() return not vim.deep_equal(lines(), report.other_jumped) end)
    report.other_after = lines()
    report.cursor_after = cursor()
    report.main_after = vim.api.nvim_buf_get_lines(bufnr, 0, -1, true)
    report.counts = vim.deepcopy(ne.counts)
    return
  end
  if mode == 'ghost' then
    -- Ghost text at another line while the next edit is shown: Tab accepts the ghost text.
    local row = tonumber(vim.env.DITTO_TEST_GHOST_LINE)
    vim.api.nvim_win_set_cursor(0, { row, 0 })
    vim.api.nvim_input('A')
    local gns = vim.api.nvim_get_namespaces()['nvim.lsp.inline_completion']
    wait_for('ghost text', 30000, function()
      return #vim.api.nvim_buf_get_extmarks(0, gns, 0, -1, {}) > 0
    end)
    report.shown_with_ghost = ne.current ~= nil
    report.ghost_row = row
    vim.api.nvim_input('<Tab>')
    wait_for('the ghost text to be accepted', 10000, function()
      return lines()[row] ~= report.before[row]
    end)
    vim.api.nvim_input('<Esc>')
    wait_for('normal mode', 5000, function() return vim.api.nvim_get_mode().mode == 'n' end)
    report.after = lines()
    report.counts = vim.deepcopy(ne.counts)
    return
  end
  if mode == 'edit' then
    -- The user edits instead: the proposal goes. Its answer, handed in again now, is for a
    -- version that is no longer current: dropped.
    local tick = ne.current.tick
    ne.debounce_ms = 1e7  -- the edit asks no more within this test
    vim.api.nvim_input('A # more<Esc>')
    wait_for('the marks to go', 5000, function() return #marks() == 0 and not ne.current end)
    local stale = ne.counts.stale
    ne.on_result(client, bufnr, tick, report.answer.result)
    report.stale = ne.counts.stale - stale
    report.shown_after_stale = ne.current ~= nil or #marks() > 0
    report.after = lines()
    report.counts = vim.deepcopy(ne.counts)
    return
  end
  vim.api.nvim_input('<Tab>')
  local row = report.answer.result.range.start.line + 1
  wait_for('the cursor to jump', 5000, function() return cursor()[1] == row end)
  report.cursor_jumped = cursor()
  report.lines_jumped = lines()
  report.marks_jumped = #marks()
  vim.api.nvim_input('<Tab>')
  wait_for('the edit to apply', 5000, function() return not vim.deep_equal(lines(), report.before) end)
  report.after = lines()
  report.cursor_after = cursor()
  report.mark_rows_after = {}  -- of the edit's own marks (not a hint at the cursor)
  for _, m in ipairs(marks()) do
    if m[4].virt_text_pos ~= 'eol' then table.insert(report.mark_rows_after, m[2]) end
  end
  report.counts = vim.deepcopy(ne.counts)
end

co = coroutine.create(function()
  local ok, err = xpcall(main, debug.traceback)
  if not ok then report.error = err end
  finish()
end)
vim.schedule(function() assert(coroutine.resume(co)) end)
"""


def run(nvim: Path, mode: str, tmp_path: Path, setup_extra: str = "", ghost_line: int = 0,
        source: str = SOURCE, other: str = "") -> dict:
    exe = require_serve()
    work = tmp_path / "project"
    work.mkdir()
    src = work / "files.py"
    src.write_text(source, encoding="utf-8")
    if other:
        (work / "use.py").write_text(other, encoding="utf-8")
    init = README_INIT.replace("~/src/ditto", str(ROOT)).replace("model = 'default',",
                                                                "model = 'tiny-random'," + setup_extra)
    return headless(nvim, DRIVER, init, src, tmp_path, exe, 90, {
        "DITTO_TEST_MODE": mode, "DITTO_TEST_GHOST_LINE": str(ghost_line),
        "DITTO_TEST_OTHER": str(work / "use.py")})


def units(s: str) -> int:
    return len(s.encode("utf-16-le")) // 2


def byte_col(line: str, character: int) -> int:
    """The byte column of a UTF-16 column of `line`."""
    seen = i = 0
    while i < len(line) and seen < character:
        seen += units(line[i])
        i += 1
    return len(line[:i].encode("utf-8"))


def applied(lines: list[str], rng: dict, new_text: str) -> list[str]:
    s, e = rng["start"], rng["end"]
    head = lines[s["line"]].encode()[: byte_col(lines[s["line"]], s["character"])].decode()
    tail = lines[e["line"]].encode()[byte_col(lines[e["line"]], e["character"]):].decode()
    return lines[: s["line"]] + (head + new_text + tail).split("\n") + lines[e["line"] + 1:]


def check_shown(r: dict) -> dict:
    """The proposal shown is the server's answer, drawn where it goes; returns the answer."""
    e = r["answer"]["result"]
    assert e["version"] == r["answer"]["version"] and e["source"] == "propagate", e
    s, end = e["range"]["start"], e["range"]["end"]
    line = r["before"][s["line"]]
    assert r["before"][s["line"]][s["character"]:end["character"]] == e["oldText"]  # ASCII file: bytes = units
    struck = [m for m in r["marks"] if m.get("hl_group") == "DittoNextEditOld"]
    assert [(m["row"], m["col"], m["end_row"], m["end_col"]) for m in struck] == [
        (s["line"], byte_col(line, s["character"]), end["line"], byte_col(line, end["character"]))]
    new = [m for m in r["marks"] if m.get("virt_text_pos") == "inline"]
    assert [(m["row"], m["col"], m["virt_text"], m["sign_text"]) for m in new] == [
        (end["line"], byte_col(line, end["character"]), e["newText"], "» ")]
    # off screen (the window shows lines 1-23): a hint at the cursor's line names the place
    hints = [m for m in r["marks"] if m.get("virt_text_pos") == "eol"]
    assert [(m["row"], m["virt_text"].strip()) for m in hints] == [
        (r["cursor_before"][0] - 1, f"» next edit at line {s['line'] + 1} (Tab)")]
    return e


@pytest.mark.parametrize("nvim", [NVIM_012, NVIM_011], ids=["0.12", "0.11"])
def test_a_typed_rename_is_proposed_at_the_next_place_tab_jumps_and_tab_applies(tmp_path, nvim):
    require(nvim)
    r = run(nvim, "apply", tmp_path)
    e = check_shown(r)
    assert "stream = KeepOpenFile(path)" in r["before"][e["range"]["start"]["line"]]  # the nearest use below
    # first Tab: the cursor at the edit's start, nothing changed, still shown
    s = e["range"]["start"]
    assert r["cursor_jumped"] == [s["line"] + 1, byte_col(r["before"][s["line"]], s["character"])]
    assert r["lines_jumped"] == r["before"] and r["marks_jumped"] > 0
    # second Tab: exactly the server's edit, the cursor where it says, the marks gone
    assert r["after"] == applied(r["before"], e["range"], e["newText"])
    assert "    stream = LazyFile(path)" in r["after"]
    c = e["cursor"]
    assert r["cursor_after"] == [c["line"] + 1, byte_col(r["after"][c["line"]], c["character"])]
    assert s["line"] not in r["mark_rows_after"]  # its marks gone (the next place's may come)
    assert r["counts"]["jumped"] == 1 and r["counts"]["applied"] == 1


def test_lines_inserted_are_proposed_as_new_lines_below_the_line_above_and_tab_tab_inserts_them(tmp_path):
    require(NVIM_012)
    r = run(NVIM_012, "insert", tmp_path, source=CALLS, ghost_line=3)  # below `name=a,` of the first call
    e = r["answer"]["result"]
    assert e["why"].startswith("insert lines") and e["oldText"] == "", e
    at = e["range"]["start"]
    assert e["range"]["end"] == at and at["line"] == 11 and at["character"] == len("            name=a,")
    # Drawn as a new line below the second call's `name=a,`, nothing on that line itself.
    new = [m for m in r["marks"] if m.get("virt_lines")]
    assert [(m["row"], m["virt_text"], m["virt_lines"], m["sign_text"]) for m in new] == [
        (11, "", ["            strict=True,"], "» ")]
    # The first <Tab> goes to the line's end (normal mode: on its last character), the second inserts.
    assert r["cursor_jumped"] == [12, len("            name=a,") - 1]
    assert r["after"] == applied(r["before"], e["range"], e["newText"])
    assert r["after"][11:14] == ["            name=a,", "            strict=True,", "            path=b,"]


def test_esc_dismisses_the_next_edit_and_nothing_changes(tmp_path):
    require(NVIM_012)
    r = run(NVIM_012, "dismiss", tmp_path)
    check_shown(r)
    assert r["after_dismiss"] == r["before"] and r["after"] == r["before"]
    assert r["cursor_after"] == r["cursor_before"]  # <Tab> jumped nowhere: no next edit after a dismiss
    assert r["counts"]["dismissed"] == 1 and r["counts"]["applied"] == 0 and r["counts"]["jumped"] == 0
    assert r["stats"]["next_edit"]["proposed"] >= 1


def test_next_edit_false_asks_nothing(tmp_path):
    require(NVIM_012)
    r = run(NVIM_012, "off", tmp_path, setup_extra=" next_edit = false,")
    assert not r["loaded"] and r["maps"] == ["", "", ""]
    assert r["stats"]["next_edit"]["requests"] == 0


def test_an_edit_clears_the_shown_next_edit_and_a_stale_answer_is_dropped(tmp_path):
    require(NVIM_012)
    r = run(NVIM_012, "edit", tmp_path)
    check_shown(r)
    assert r["after"][0] == "class LazyFile: # more" and r["after"][1:] == r["before"][1:]  # only the user's edit
    assert r["counts"]["cleared"] == 1 and r["counts"]["applied"] == 0, r["counts"]
    assert r["stale"] == 1 and not r["shown_after_stale"]


def test_ghost_text_keeps_tab_while_a_next_edit_is_shown(tmp_path):
    """Insert mode at a line where tiny-random suggests something, the next edit still shown: Tab
    accepts the ghost text, and neither jumps to nor applies the next edit."""
    from tests.editors.test_editor_nvim_plugin import first_suggesting_line

    require(NVIM_012)
    renamed = SOURCE.replace("class KeepOpenFile:", "class LazyFile:")
    # run() edits tmp_path/project/files.py: the server's prompt names that path.
    line = first_suggesting_line(renamed, str(tmp_path / "project" / "files.py"))
    r = run(NVIM_012, "ghost", tmp_path, ghost_line=line)
    e = check_shown(r)
    assert r["shown_with_ghost"]  # both were shown when Tab was pressed
    row = r["ghost_row"] - 1
    assert r["after"][row].startswith(r["before"][row]) and r["after"][row] != r["before"][row]  # ghost text in
    place = r["before"][e["range"]["start"]["line"]]
    assert "KeepOpenFile" in place and place in r["after"]  # the next edit's place untouched
    assert r["counts"]["applied"] == 0 and r["counts"]["jumped"] == 0


def test_a_next_edit_in_another_open_file_is_hinted_and_tab_goes_there(tmp_path):
    """The renamed class is used only in another open file: a hint at the cursor names it, Tab
    opens it at the place in the window, Tab applies the server's edit there."""
    require(NVIM_012)
    lib = 'class KeepOpenFile:\n    """A file that stays open."""\n'
    use = "from files import KeepOpenFile\n\n\ndef open_stream(path):\n    return KeepOpenFile(path)\n"
    r = run(NVIM_012, "other", tmp_path, source=lib, other=use)
    e = r["answer"]["result"]
    assert e["uri"].endswith("/project/use.py") and r["other_before"] == use.splitlines()
    s = e["range"]["start"]
    assert r["hint"].strip() == f"» next edit at use.py:{s['line'] + 1} (Tab)"
    assert r["cursor_jumped"] == [s["line"] + 1, s["character"]] and r["other_jumped"] == r["other_before"]
    assert r["other_after"] == applied(r["other_before"], e["range"], e["newText"])
    assert r["other_after"][0] == "from files import LazyFile"
    assert r["cursor_after"] == [e["cursor"]["line"] + 1, e["cursor"]["character"]]
    assert r["main_after"] == r["before"]  # the file renamed in is left as the user left it
    assert r["counts"]["jumped"] == 1 and r["counts"]["applied"] == 1


def test_the_next_edit_on_the_typed_line_is_ghost_text_over_the_old_text_and_tab_makes_it(tmp_path):
    """The server's inline item (lsp_server/lsp/nextedit.py `inline_item`) in vim.lsp.inline_completion:
    the rest of the line with the rename made is overlaid from its first changed character, and the
    accept key replaces the old text with it."""
    require(NVIM_012)
    source = SOURCE.replace("    handle = KeepOpenFile(path)\n", "    handle = KeepOpenFile(path) or KeepOpenFile(None)\n")
    row = source.splitlines().index("    handle = KeepOpenFile(path) or KeepOpenFile(None)") + 1
    r = run(NVIM_012, "inline", tmp_path, ghost_line=row, source=source)
    assert "error" not in r, r.get("error")
    assert r["typed"] == "    handle = KeepClosedFile(path) or KeepOpenFile(None)"
    # overlaid where the old name starts to differ: "Keep" stays, "ClosedFile(None)" covers the rest
    assert r["shown"] == {"row": row - 1, "col": r["typed"].index("OpenFile"), "text": "ClosedFile(None)",
                          "pos": "overlay"}
    assert r["accepted_line"] == "    handle = KeepClosedFile(path) or KeepClosedFile(None)"
    assert r["after"][row - 1] == r["accepted_line"]
    assert r["after"][: row - 1] == r["before"][: row - 1] and r["after"][row:] == r["before"][row:]
    assert r["stats"]["next_edit"]["inline"] >= 1
