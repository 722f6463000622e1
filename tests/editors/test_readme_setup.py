"""The README's set-up is what CI and the editor tests do: its two commands are .ci/run's, its Neovim
init.lua is the Neovim tests' (tests/editors/test_editor_nvim_plugin.py README_INIT), and its VS Code
build, install and settings are what editors/vscode/test/e2e.sh does (which only puts the test's model,
tiny-random unless DITTO_E2E_MODEL says otherwise, and the repository's server in). No editor runs here."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.editors.test_editor_nvim_plugin import README_INIT

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
E2E = (ROOT / "editors" / "vscode" / "test" / "e2e.sh").read_text(encoding="utf-8")
# What e2e.sh's scenarios add to the README's settings: the server's test flags (the load delay; none in
# the other scenarios), and each scenario's own (the accept scenario answers whole suggestions).
TEST_ONLY = {"ditto.serverArgs", "ditto.firstAnswerS"}


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README, re.S | re.M)


def test_the_readme_commands_are_what_ci_runs():
    first = blocks("sh")[0].splitlines()
    ci = [line for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
          if line and not line.startswith(("#", "set ", "cd "))]
    assert first == ci and len(ci) == 2


def test_the_readme_neovim_init_is_the_one_the_neovim_tests_use():
    assert blocks("lua") == [README_INIT]


def readme_vscode_settings() -> dict:
    (jsonc,) = blocks("jsonc")
    return json.loads(re.sub(r"//.*", "", jsonc))


def e2e_settings() -> dict[str, str]:
    """The `ditto.*` lines of the settings.json e2e.sh writes, as written (shell variables unexpanded)."""
    body = re.search(r'cat >"\$UDD/User/settings.json" <<EOF\n(.*?)\nEOF', E2E, re.S).group(1)
    found = dict(re.findall(r'^\s*"(ditto\.\w+)": (.*?),?$', body, re.M))
    extra = re.findall(r'"(ditto\.\w+)": ', " ".join(re.findall(r"EXTRA_SETTINGS='([^']*)'", E2E)))
    return {**found, **{k: "(scenario)" for k in extra}}


def test_the_readme_vscode_settings_are_the_ones_the_vscode_test_writes():
    mine, theirs = readme_vscode_settings(), e2e_settings()
    assert set(mine) == {"ditto.serverCommand", "ditto.model"}
    assert set(theirs) - TEST_ONLY == set(mine), theirs
    # the server: the repository's .venv (the README's clone), or the wrapper that holds its load back
    assert mine["ditto.serverCommand"].endswith("/.venv/bin/ditto-lsp") and theirs["ditto.serverCommand"] == '"$SERVER_CMD"'
    assert re.search(r'^DITTO_LSP="\$\{DITTO_LSP:-\$REPO/\.venv/bin/ditto-lsp\}"$', E2E, re.M)
    # the model: the README's, or the test's random one by default
    assert mine["ditto.model"] == "default" and theirs["ditto.model"] == '"$MODEL"'
    assert re.search(r'^MODEL="\$\{DITTO_E2E_MODEL:-tiny-random\}"$', E2E, re.M)


def test_the_vscode_test_builds_and_installs_the_extension_as_the_readme_says():
    (install,) = [b for b in blocks("sh") if "--install-extension" in b]
    steps = [s.strip() for s in install.strip().split("&&")]
    assert steps == ["cd editors/vscode", "npm ci", "npm run package", "code --install-extension ditto-vscode.vsix"]
    assert 'cd "$HERE"' in E2E and "npm ci --no-audit --no-fund -q" in E2E and "npm run -s package" in E2E
    assert 'VSIX="$HERE/ditto-vscode.vsix"' in E2E and '--install-extension "$VSIX"' in E2E
