"""Real editor: the packaged VS Code extension in code-server, driven through chromium
(editors/vscode/test/e2e.sh and e2e-driver.mjs; e2e-next-edit.mjs for next-edit suggestions), so
that CI notices when VS Code breaks.

e2e.sh installs what it needs (Debian's chromium and build tools through apt-get, Node 24,
code-server and playwright-core from npm under ~/.local/share/ditto-vscode-e2e; the first run
builds code-server's native modules, minutes). It types while the model still loads (the
server's --debug-load-delay), then waits for the ghost text and accepts it with Tab.
The test is skipped only where e2e.sh cannot run at all: no bash, no npm, or Debian packages
missing with no apt-get, or no root or sudo to run it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.editor

ROOT = Path(__file__).resolve().parents[2]
E2E = ROOT / "editors" / "vscode" / "test" / "e2e.sh"
DRIVER = E2E.with_name("e2e-driver.mjs")
ACCEPT = E2E.with_name("e2e-accept.mjs")
FIXTURE = E2E.with_name("fixtures") / "example.py"
DEBIAN = ("chromium", "libkrb5-dev", "libxkbfile-dev", "libsecret-1-dev", "build-essential")


def missing_debian_packages() -> list[str]:
    if shutil.which("dpkg") is None:
        return list(DEBIAN)
    return [p for p in DEBIAN if subprocess.run(["dpkg", "-s", p], capture_output=True).returncode != 0]


def cannot_run() -> str | None:
    """Why e2e.sh cannot run on this machine, or None."""
    if shutil.which("bash") is None:
        return "no bash"
    if shutil.which("npm") is None:
        return "no npm: e2e.sh installs Node 24, code-server and playwright-core with it"
    missing = missing_debian_packages()
    if missing:
        if shutil.which("apt-get") is None:
            return f"Debian packages {' '.join(missing)} are missing and there is no apt-get to install them"
        if os.geteuid() != 0 and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode != 0:
            return f"Debian packages {' '.join(missing)} are missing and there is no root or sudo to install them"
    return None


def test_e2e_types_where_tiny_random_suggests_something():
    """The premise of the end-to-end test: at the position it types (fixed file path, so the same
    prompt every run), tiny-random's suggestion has a visible first line."""
    from lsp_server.settings import Settings
    from support.completers import like_the_server

    typed = re.search(r'^const TYPED = "([^"]*)";', DRIVER.read_text(), re.M).group(1)
    workspace = re.search(r"^WS=(\S+)$", E2E.read_text(), re.M).group(1)
    text = FIXTURE.read_text(encoding="utf-8") + typed
    lines = text.split("\n")
    sug = like_the_server().complete(text, len(lines) - 1, len(lines[-1]), name=f"{workspace}/example.py",
                                     options=Settings().decode_options())
    assert sug.text.split("\n")[0].strip(), f"pick another TYPED in {DRIVER.name}: the suggestion is {sug.text!r}"


def run_e2e(shots: Path, scenario: str | None = None) -> str:
    """Run e2e.sh (`scenario`: its DITTO_E2E_SCENARIO) with screenshots and logs in `shots`; its output.
    Skips where it cannot run; fails unless it passed."""
    why = cannot_run()
    if why:
        pytest.skip(f"cannot run {E2E.relative_to(ROOT)}: {why}")
    exe = Path(sys.executable).parent / "ditto-lsp"
    env = {**os.environ, "DITTO_LSP": str(exe if exe.exists() else shutil.which("ditto-lsp") or exe)}
    if scenario:
        env["DITTO_E2E_SCENARIO"] = scenario
    # Generous: a first run installs packages and builds code-server (minutes on two cores).
    proc = subprocess.run(["bash", str(E2E), str(shots)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=2400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "e2e: PASS" in out, out[-6000:]
    return out


def test_vscode_ghost_text_typed_while_the_model_loads_appears_and_tab_accepts_it(tmp_path):
    out = run_e2e(tmp_path / "shots")
    assert "request(s) waited for the model" in out, out[-6000:]


def logged(shots: Path) -> list[tuple[str, dict | None]]:
    """What the extension logged of next edits, in order: ("shown" | "applied", the server's answer)
    and ("dismissed", None)."""
    found = []
    for log in sorted(shots.glob("Ditto*.log")):
        for line in log.read_text(encoding="utf-8").splitlines():
            m = re.search(r"next edit (shown|applied|dismissed)(?:: (\{.*\}))?\s*$", line)
            if m:
                found.append((m.group(1), json.loads(m.group(2)) if m.group(2) else None))
    return found


def offset(text: str, pos: dict) -> int:
    """The offset of an LSP position in `text` (the fixture is ASCII: UTF-16 units are characters)."""
    lines = text.split("\n")
    return sum(len(line) + 1 for line in lines[: pos["line"]]) + pos["character"]


def test_vscode_next_edit_tab_jumps_tab_applies_escape_dismisses(tmp_path):
    """A rename typed at a class's definition; the next edit the server proposes shows as struck
    old text with the new text after it, Tab moves the cursor to it, Tab applies exactly it and
    puts the cursor where the server said; the edit after it is dismissed with Escape, nothing
    changes, and Tab then indents as Tab does. Then the cursor's own line: a name renamed at the first
    of its two uses there, the server's inline item is drawn and Tab makes the edit at the second.
    Then a line inserted into a call: drawn after the line above its place in the other call, Tab,
    Tab inserts it."""
    from tests.nextedit.test_propagate import CALLS

    # the calls are the propagation tests' own (tests/nextedit/test_propagate.py), as in Neovim's test
    assert (E2E.with_name("fixtures") / "next_edit.py").read_text(encoding="utf-8").endswith("\n\n\n" + CALLS)
    shots = tmp_path / "shots"
    run_e2e(shots, "next-edit")
    r = json.loads((shots / "next-edit.json").read_text(encoding="utf-8"))
    # The log holds what the user saw of next edits, and how many proposals come and go meanwhile is the
    # machine's timing (a proposal for a half-typed name may show and go; one may come after Tab indents
    # and go with the Escape before the line's rename): the checks are what was shown when each key was
    # pressed and the text each key left. The driver applies three edits (Tab, Tab each), each the one
    # shown last before it, and dismisses one with Escape after the first.
    events = logged(shots)
    kinds = [k for k, _ in events]

    def last_shown(before: int) -> dict:
        return next(events[k][1] for k in range(before - 1, -1, -1) if kinds[k] == "shown")

    assert kinds.count("applied") == 3, kinds  # the rename's next place, the line's edit, the inserted line
    i, i_line, i_inserted = [k for k, kind in enumerate(kinds) if kind == "applied"]
    first = events[i][1]
    assert last_shown(i) == first  # the edit applied is the one shown last before it
    j = kinds.index("dismissed", i)  # Escape on the edit after it
    assert "shown" in kinds[i + 1:j] and j < i_line, kinds
    second = last_shown(j)
    before = r["before"]
    assert "class LazyFile:" in before
    # drawn: the server's old text struck through, its new text after it
    assert r["shown"]["struck"] == first["oldText"] and first["newText"] in r["shown"]["after"]
    # Tab: the cursor at the edit's start (the status bar's Ln/Col are 1-based), still shown
    start = first["range"]["start"]
    assert r["cursor_jumped"] == [start["line"] + 1, start["character"] + 1]
    assert r["shown_after_jump"]["struck"] == first["oldText"]
    # Tab: exactly the server's edit, the cursor where it said
    a, b = offset(before, first["range"]["start"]), offset(before, first["range"]["end"])
    assert r["applied"] == before[:a] + first["newText"] + before[b:]
    assert "    stream = LazyFile(path)" in r["applied"]
    assert r["cursor_applied"] == [first["cursor"]["line"] + 1, first["cursor"]["character"] + 1]
    # the next one shown, then dismissed: nothing changed
    assert r["next"]["struck"] == second["oldText"]
    assert r["after_dismiss"] == r["applied"]
    # nothing shown: Tab indents at the cursor (to the next tab stop of 4 spaces)
    line, col = r["cursor_dismissed"][0] - 1, r["cursor_dismissed"][1] - 1
    at = offset(r["applied"], {"line": line, "character": col})
    assert r["after_tab"] == r["applied"][:at] + " " * (4 - col % 4) + r["applied"][at:]
    # the cursor's line: `OpenMode` renamed at the first of two uses; the server's inline item (a range
    # replacing the rest of the line, no insertion) is left to the next edit, which shows the same change
    # at the second use; Tab goes there, Tab makes it
    assert "    return ClosedMode(path) or OpenMode(None)\n" in r["line_typed"], r["line_typed"]
    log = "".join(p.read_text(encoding="utf-8") for p in shots.glob("Ditto*.log"))
    assert "inline item replacing text after the cursor, not drawable as ghost text" in log
    assert r["line_shown"]["struck"] == "Open" and r["line_shown"]["after"] == ["Closed"] and not r["line_shown"]["ghost"]
    assert r["line_after"] == r["line_typed"].replace("ClosedMode(path) or OpenMode(None)",
                                                      "ClosedMode(path) or ClosedMode(None)"), r["line_shown"]
    # the line's edit, then the inserted line's: each the one shown last before its Tab, Tab
    line_edit, inserted = events[i_line][1], events[i_inserted][1]
    assert last_shown(i_line) == line_edit and last_shown(i_inserted) == inserted, kinds
    assert (line_edit["oldText"], line_edit["newText"]) == ("Open", "Closed"), kinds
    # Lines inserted: `strict=True,` typed after the first call's `name=a,`; the next edit inserts it
    # after the second call's (off screen: a hint at the cursor first), drawn after that line's end with
    # ⏎ for the line break and nothing struck; Tab goes there, Tab inserts it where the server said.
    assert inserted["why"].startswith("insert lines") and inserted["oldText"] == ""
    assert inserted["newText"] == "\n            strict=True,"
    assert r["insert_typed"] == r["line_after"].replace("name=a,\n", "name=a,\n        strict=True,\n", 1)
    # (whether the place is still on screen when the proposal comes depends on when the editor scrolled:
    # the hint names the place where it is drawn, and the place's own drawing may be in view already)
    hint = f"  » next edit at line {inserted['range']['start']['line'] + 1} (Tab)"
    assert r["insert_hint"]["after"] and set(r["insert_hint"]["after"]) <= {hint, " ⏎             strict=True,"}, r[
        "insert_hint"]
    at = inserted["range"]["start"]
    assert r["insert_jumped"] == [at["line"] + 1, at["character"] + 1]
    assert r["insert_shown"] == {"struck": "", "after": [" ⏎             strict=True,"]}
    a = offset(r["insert_typed"], at)
    assert r["insert_after"] == r["insert_typed"][:a] + inserted["newText"] + r["insert_typed"][a:]
    assert r["insert_after"].endswith("            name=a,\n            strict=True,\n            path=b,\n        )\n")
    assert r["insert_applied_cursor"] == [inserted["cursor"]["line"] + 1, inserted["cursor"]["character"] + 1]


# VS Code's default word definition (editor/common/core/wordHelper.ts, DEFAULT_WORD_REGEXP): Python's
# language configuration in code-server 4.139.1 sets none of its own.
_VSCODE_WORD = re.compile(r"(-?[0-9]*\.[0-9][0-9A-Za-z_]*)|([^`~!@#$%^&*()\-=+\[{\]}\\|;:'\",.<>/?\s]+)")


def vscode_word(ghost: str) -> str:
    """What editor.action.inlineSuggest.acceptNextWord (Ctrl+Right) accepts of `ghost`, VS Code 1.139's rule
    (inlineCompletionsModel acceptNextWord): up to the end of the first word, or to the start of the first
    word when the ghost text does not start with one, or to the end of the first blanks if sooner."""
    m = _VSCODE_WORD.search(ghost)
    cut = (len(m.group(0)) if m.start() == 0 else m.start()) if m else len(ghost)
    blanks = re.search(r"\s+", ghost)
    if blanks and blanks.end() < cut:
        cut = blanks.end()
    return ghost[:cut]


def vscode_line(ghost: str) -> str:
    """What editor.action.inlineSuggest.acceptNextLine (Ctrl+Down, the extension's key) accepts of `ghost`:
    up to its first line break, that line break included, or all of it."""
    i = ghost.find("\n")
    return ghost if i < 0 else ghost[: i + 1]


def test_vscode_word_and_line_rules():
    assert vscode_word("dataclasses\") St") == "dataclasses"
    assert vscode_word('") St') == '") '
    assert vscode_word("  foo") == "  " and vscode_word("foo bar") == "foo" and vscode_word(" bar") == " "
    assert vscode_word("1.5e3 x") == "1.5e3" and vscode_word("...") == "..."
    assert vscode_line("a b\n    c") == "a b\n" and vscode_line("a b") == "a b"


def test_e2e_accept_types_where_tiny_random_suggests_several_words():
    """The premise of the partial-accept test: where it types (fixed path, so the same prompt every run),
    tiny-random's whole suggestion (ditto.firstAnswerS null, as e2e.sh sets it for that scenario) has a
    first line of which Ctrl+Right accepts a part."""
    from lsp_server.settings import Settings
    from support.completers import like_the_server

    typed = re.search(r'^const TYPED = "([^"]*)";', ACCEPT.read_text(), re.M).group(1)
    assert re.search(r'^  accept\) FIXTURE=example.py .*\n.*"ditto.firstAnswerS": null', E2E.read_text(), re.M)
    workspace = re.search(r"^WS=(\S+)$", E2E.read_text(), re.M).group(1)
    text = FIXTURE.read_text(encoding="utf-8") + typed
    lines = text.split("\n")
    sug = like_the_server().complete(text, len(lines) - 1, len(lines[-1]), name=f"{workspace}/example.py",
                                     options=Settings(first_answer_s=None).decode_options())
    first = sug.text.split("\n")[0]
    assert first.strip() and vscode_word(first) != first, f"pick another TYPED in {ACCEPT.name}: {sug.text!r}"


def test_vscode_accept_next_word_then_next_line(tmp_path):
    """Ghost text from Ditto, Ctrl+Right accepts its next word (VS Code's own key), the rest stays shown,
    Ctrl+Down (the extension's key for VS Code's acceptNextLine) accepts its next line; the saved file
    after each key is the text before it plus exactly that part of what was shown. The rest is answered
    by the server's type-through when VS Code asks again (ditto/stats)."""
    shots = tmp_path / "shots"
    run_e2e(shots, "accept")
    r = json.loads((shots / "accept.json").read_text(encoding="utf-8"))
    start = r["before"] + r["typed"]
    word_step, line_step = r["steps"]
    assert word_step["key"] == "Control+ArrowRight" and line_step["key"] == "Control+ArrowDown"
    ghost = word_step["ghost"]
    part = vscode_word(ghost)
    assert part and part != ghost, ghost  # (the premise test: a line of several words)
    assert word_step["after"] == start + part
    # the rest of the same suggestion is what was shown when Ctrl+Down was pressed
    assert line_step["ghost"] == ghost[len(part):]
    assert line_step["after"] == start + part + vscode_line(line_step["ghost"])
    log = "".join(p.read_text(encoding="utf-8") for p in shots.glob("Ditto*.log"))
    typethrough = [int(n) for n in re.findall(r'"typethrough": (\d+)', log)]
    assert typethrough and typethrough[-1] >= 1, typethrough
