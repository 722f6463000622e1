"""The server, Neovim and Emacs end-to-end, fuzz and fault suites once more, on the llama.cpp backend.

The suites start `ditto-lsp serve --model tiny-random`; with DITTO_BACKEND=llama.cpp in the
environment the server (and every in-process reference model) runs tiny-random as a GGUF on
llama.cpp instead (lsp_server/backends/tiny_gguf.py; docs/backends.md). This test runs them in a child
pytest with that variable, so one `pytest` covers both backends; test_server.py checks that
`ditto/stats` reports the backend the run chose. Skipped where the llama.cpp library cannot run, and
inside a run that already chose a backend.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUITES = ["tests/lsp/test_server.py", "tests/lsp/test_faults.py", "tests/lsp/test_fuzz_protocol.py", "tests/editors/test_editor_emacs.py",
          "tests/editors/test_editor_nvim_plugin.py", "tests/editors/test_nvim_inline.py"]


@pytest.mark.skipif(bool(os.environ.get("DITTO_BACKEND")), reason="this run already chose a backend")
def test_server_editor_fuzz_and_fault_suites_pass_on_llama_cpp():
    from lsp_server.backends.llama.library import problem

    if problem():
        pytest.skip(f"no llama.cpp library: {problem()}")
    env = {**os.environ, "DITTO_BACKEND": "llama.cpp", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *SUITES], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=3600)
    tail = r.stdout[-8000:] + r.stderr[-2000:]
    assert r.returncode == 0, tail
    summary = r.stdout.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", summary) and "failed" not in summary, tail
    print(summary)
