"""Real editor: the packaged VS Code extension in code-server, driven through chromium
(editors/vscode/test/e2e.sh and e2e-driver.mjs), so that CI notices when VS Code breaks.

e2e.sh installs what it needs (Debian's chromium and build tools through apt-get, Node 24,
code-server and playwright-core from npm under ~/.local/share/ditto-vscode-e2e; the first run
builds code-server's native modules, minutes). It types while the model still loads (the
server's --debug-load-delay), then waits for the ghost text and accepts it with Tab.
The test is skipped only where e2e.sh cannot run at all: no bash, no npm, or Debian packages
missing with no apt-get, or no root or sudo to run it.
"""

from __future__ import annotations

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


def test_vscode_ghost_text_typed_while_the_model_loads_appears_and_tab_accepts_it(tmp_path):
    why = cannot_run()
    if why:
        pytest.skip(f"cannot run {E2E.relative_to(ROOT)}: {why}")
    exe = Path(sys.executable).parent / "ditto-lsp"
    env = {**os.environ, "DITTO_LSP": str(exe if exe.exists() else shutil.which("ditto-lsp") or exe)}
    # Generous: a first run installs packages and builds code-server (minutes on two cores).
    proc = subprocess.run(["bash", str(E2E), str(tmp_path / "shots")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=2400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "e2e: PASS" in out, out[-6000:]
    assert "request(s) waited for the model" in out, out[-6000:]
