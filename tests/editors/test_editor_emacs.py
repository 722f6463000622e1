"""Emacs 28 + eglot (Debian's elpa-eglot), batch mode, configured with editors/emacs/ditto-eglot.el
(the README's Emacs configuration): eglot connects to `ditto-lsp serve --model tiny-random`, and the
completion fallback (textDocument/completion through completion-at-point) inserts Ditto's suggestion.

The expected buffer is computed from the server's own response, recorded inside Emacs, so the test
never checks against a made-up suggestion. Skips with the reason when Emacs, eglot or the server
command is absent (editors/install.sh installs Emacs and eglot where apt-get is available).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.editor

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "editors" / "emacs" / "ditto-eglot.el"
EXAMPLE = ROOT / "examples" / "shapes.py"

# Loaded after the configuration. Awaits each condition by polling with a deadline (no fixed
# sleeps), writes what it saw to $DITTO_TEST_OUT as JSON and exits.
DRIVER = r"""
(require 'json)
(require 'cl-lib)
(defvar ditto-test-responses nil "textDocument/completion results, newest first, as received.")
(defun ditto-test--record (orig server method &rest args)
  (let ((resp (apply orig server method args)))
    (when (eq method :textDocument/completion) (push resp ditto-test-responses))
    resp))
(advice-add 'jsonrpc-request :around #'ditto-test--record)

(defun ditto-test--wait (what secs pred)
  (let ((deadline (+ (float-time) secs)) v)
    (while (not (setq v (funcall pred)))
      (when (> (float-time) deadline) (error "timed out after %ss waiting for %s" secs what))
      (accept-process-output nil 0.05))
    v))

(let ((out (getenv "DITTO_TEST_OUT"))
      (lines (append (json-read-from-string (getenv "DITTO_TEST_LINES")) nil))
      (deadline (+ (float-time) (string-to-number (getenv "DITTO_TEST_BUDGET_S"))))
      (report (list :log nil)))
  (condition-case err
      (progn
        (find-file (getenv "DITTO_TEST_FILE"))
        (plist-put report :mode (symbol-name major-mode))
        ;; eglot-ensure connects from post-command-hook, which only the command loop runs
        (run-hooks 'post-command-hook)
        (let ((server (ditto-test--wait "eglot to connect" 30 #'eglot-current-server)))
          (plist-put report :server (format "%s" (process-command (jsonrpc--process server))))
          (plist-put report :completion-provider
                     (if (eglot--server-capable :completionProvider) t :json-false)))
        (let ((before (buffer-substring-no-properties (point-min) (point-max)))
              done)
          ;; Until the model is loaded the server answers null, and tiny-random's noise is
          ;; sometimes cut to nothing: try ends of lines until a suggestion is inserted.
          (while (not done)
            (dolist (ln lines)
              (unless done
                (when (> (float-time) deadline) (error "no suggestion inserted before the deadline"))
                (goto-char (point-min)) (forward-line (1- ln)) (end-of-line)
                (setq ditto-test-responses nil)
                (completion-at-point)
                (if (string= before (buffer-substring-no-properties (point-min) (point-max)))
                    (push (format "line %s: nothing inserted (%S)" ln ditto-test-responses)
                          (plist-get report :log))
                  (setq done t)
                  (plist-put report :line ln)
                  (plist-put report :responses (length ditto-test-responses))
                  (plist-put report :response (car ditto-test-responses))))))
          (plist-put report :before before)
          (plist-put report :after (buffer-substring-no-properties (point-min) (point-max)))))
    (error (plist-put report :error (error-message-string err))))
  (plist-put report :log (vconcat (plist-get report :log)))
  (with-temp-file out (insert (json-encode report)))
  (kill-emacs 0))
"""


def ditto_lsp() -> str | None:
    here = Path(sys.executable).parent / "ditto-lsp"
    return str(here) if here.exists() else shutil.which("ditto-lsp")


def end_of_line_candidates(text: str) -> list[int]:
    """1-based lines ending in a character that starts no symbol (a fresh completion, empty prefix)."""
    return [i for i, line in enumerate(text.splitlines(), 1) if line.rstrip() and line[-1] in ":(,=[{"]


def apply_edit(text: str, rng: dict, new: str) -> str:
    """Replace the LSP range (UTF-16 positions) of `text` with `new`."""
    lines = text.split("\n")

    def offset(pos: dict) -> int:
        line = lines[pos["line"]]
        units, i = 0, 0
        while units < pos["character"] and i < len(line):
            units += 2 if ord(line[i]) > 0xFFFF else 1
            i += 1
        return sum(len(s) + 1 for s in lines[: pos["line"]]) + i

    return text[: offset(rng["start"])] + new + text[offset(rng["end"]):]


def test_emacs_eglot_completion_fallback_inserts_the_suggestion(tmp_path):
    emacs = shutil.which("emacs")
    if emacs is None:
        pytest.skip("emacs not installed: run editors/install.sh (apt-get install emacs-nox elpa-eglot)")
    probe = subprocess.run([emacs, "--batch", "-q", "--eval", "(require 'eglot)"], capture_output=True, text=True,
                           timeout=60, env={**os.environ, "HOME": str(tmp_path)})
    if probe.returncode != 0:
        pytest.skip("eglot not available to Emacs: run editors/install.sh (apt-get install elpa-eglot)")
    exe = ditto_lsp()
    if exe is None:
        pytest.skip("ditto-lsp is not installed (pip install -e .)")
    if subprocess.run([exe, "serve", "--help"], capture_output=True, timeout=60).returncode != 0:
        pytest.skip("`ditto-lsp serve` is not available")

    work = tmp_path / "project"
    work.mkdir()
    src = work / "shapes.py"
    src.write_text(EXAMPLE.read_text(encoding="utf-8"), encoding="utf-8")
    config_text = CONFIG.read_text(encoding="utf-8")
    assert ':model "default"' in config_text
    config = tmp_path / "ditto-eglot.el"
    config.write_text(config_text.replace(':model "default"', ':model "tiny-random"'), encoding="utf-8")
    driver = tmp_path / "driver.el"
    driver.write_text(DRIVER, encoding="utf-8")
    out = tmp_path / "out.json"
    budget_s = 40
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "PATH": f"{Path(exe).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "DITTO_TEST_OUT": str(out),
        "DITTO_TEST_FILE": str(src),
        "DITTO_TEST_LINES": json.dumps(end_of_line_candidates(src.read_text(encoding="utf-8"))),
        "DITTO_TEST_BUDGET_S": str(budget_s),
    }
    cmd = [emacs, "--batch", "-q", "-l", str(config), "-l", str(driver)]
    try:
        proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=budget_s + 20)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"Emacs did not finish: {err}")
    if not out.exists():
        pytest.fail(f"Emacs wrote no report (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    r = json.loads(out.read_text(encoding="utf-8"))
    assert "error" not in r, f"{r['error']}\nlog: {r.get('log')}\nstderr: {proc.stderr[-3000:]}"

    assert r["mode"] == "python-mode"
    assert "ditto-lsp serve" in r["server"]
    assert r["completion-provider"] is True
    result = r["response"]
    items = result["items"] if isinstance(result, dict) else result
    assert len(items) == 1
    item = items[0]
    edit = item.get("textEdit")
    if edit:
        expected = apply_edit(r["before"], edit["range"], edit["newText"])
        suggestion = edit["newText"]
    else:  # no textEdit: eglot inserts insertText (or the label) at point
        suggestion = item.get("insertText") or item["label"]
        lines = r["before"].split("\n")
        at = sum(len(s) + 1 for s in lines[: r["line"] - 1]) + len(lines[r["line"] - 1])
        expected = r["before"][:at] + suggestion + r["before"][at:]
    assert suggestion.strip()
    assert r["after"] == expected
