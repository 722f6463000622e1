"""The server's settings: one dataclass, built from CLI flags, then the client's options.

Sources, later ones override earlier ones: the defaults below, `ditto-lsp serve` flags,
`initializationOptions`, and every `workspace/didChangeConfiguration`. The client may
send the options flat or under a "ditto" key, in snake_case or camelCase
(`maxTokens` == `max_tokens`). Unknown keys are ignored with a warning; a value of the
wrong type or out of range raises SettingsError with one line naming the key.

This dataclass is the one list of settings. The `serve` flags (lsp_server/commands/options.py add_model_args /
add_decode_args), the VS Code settings (editors/vscode/package.json, src/config.ts) and
the Neovim `setup()` options (editors/nvim/lua/ditto/init.lua) are checked against
`Settings.user_keys()` by tests/lsp/test_settings_paths.py, which fails when one drifts.

The `debug_*` settings are test hooks (slow or failing model passes, a dump of the
server's copy of a document). A client can set them only when the server was started
with `ditto-lsp serve --debug-hooks`, a flag no client can set; otherwise they are
ignored (`merged(..., refused=...)` names them so the server logs one warning).

Left out on purpose: pygls, torch (this module is imported by the CLI before either).
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field, fields

from drafters.registry import DRAFTERS  # the drafter names; every list of them is this one
from lsp_server.nextedit import PROPOSERS  # the next-edit proposers' names
from lsp_server.backends.loader import BACKENDS
from lsp_server.completion.context import ContextBudget  # plain Python: no torch at import
from lsp_server.completion.settings import CompleterSettings  # plain Python too
from lsp_server.completion.show import RULES, SHOW_CHOICES  # plain Python too

DEBUG_PREFIX = "debug_"  # settings named so are test hooks, off unless `serve --debug-hooks`
CLI_ONLY = ("debug_hooks",)  # settable by `ditto-lsp serve` flags only, never by a client
ALIASES = {"time_budget": "time_budget_s"}  # client key (snake_case) -> field


class SettingsError(ValueError):
    """A client or CLI option has the wrong type or is out of range."""


@dataclass(frozen=True)
class Settings:
    # -- model (changing any of these reloads the model) -------------------------------
    model: str = "default"  # default | qwen2.5-coder-0.5b | tiny-random | FILE.gguf | DIR | hub id
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    backend: str = "auto"  # auto | torch | llama.cpp (lsp_server/backends/loader.py choose_backend)
    trust_remote_code: bool = False  # let a model directory's own Python code run
    # A remote engine's transport (model = http[s]://HOST:PORT/v1#NAME; docs/team.md): {"headers": {...}
    # (never logged; values may use ${DITTO_*} variables), "caFile", "certFile", "keyFile", "body": {extra
    # request fields}, "connectTimeoutS"}. Not in repr: the headers carry credentials.
    remote: dict = field(default_factory=dict, repr=False)
    # -- decoding ------------------------------------------------------------------------
    drafter: str = "ngram"  # one of DRAFTERS: none | ngram | model | hybrid
    draft_model: str = "qwen2.5-coder-0.5b"  # model spec of the model / hybrid drafters (same tokenizer as model)
    max_tokens: int = 64  # token budget of one suggestion
    # Prompt budget in tokens (completion/context.py ContextBudget.scaled); 0: the largest that answers a place
    # not visited yet within the time goal on this machine, fitted when the model loads from what a prompt
    # token and a generated token cost there (completion/fitting.py `fitting_budget`, a multiple of 32: 384 on
    # one core of the development machine, 2048 on a GPU, never under 256). A bigger prompt is more often right and costs
    # its prefill at every new place (docs/design.md, "Prompt layout and windows"); `ditto/stats` says what was chosen.
    context_tokens: int = 0
    # What of the other open buffers the prompt holds (completion/context.py ContextBudget.scaled): heads = each
    # one's start, from a budget of 1024 tokens on; similar = their chunks most like the code above the cursor
    # (completion/retrieval.py), at every budget, in place of some lines above; none.
    snippets: str = "heads"
    draft_max: int = 8  # longest draft verified in one pass; 0 = plain decoding
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    time_budget_s: float | None = 5.0  # stop decoding after this long (None = no limit)
    # Answer with the first complete line, or after this long decoding, and generate the rest while the
    # user pauses (completion/place.py Place; None = answer when the whole suggestion is there).
    first_answer_s: float | None = 1.0
    multiline: bool = True  # ghost text may span lines (until the current block ends)
    # What of a suggestion is shown (completion/show.py): all = everything the model wrote; sure = up to where
    # it becomes unsure, nothing when it is unsure from the start; surest = less still. Chosen by measurement
    # (docs/design.md, "What to show"): sure halves the wrong suggestions on screen for a little of what is kept.
    show: str = "sure"
    # Let the `show` limit follow what this user keeps (lsp_server/lsp/shown.py): accepted suggestions show a
    # little more, typed-over ones a little less, within completion/show.py BIAS_LIMIT; kept per workspace.
    learn_show: bool = True
    adaptive: bool = True  # choose each draft's length from measured pass costs; False = verify draft_max tokens
    idle_prefill: bool = True  # prefill the likely next prompt, then generate its suggestion, while the user pauses
    # The whole file above the place from a warm KV per open file, filled while the user pauses
    # (completion/wholefile.py; docs/design.md, "The whole file above the cursor"). Off by default: the fill
    # keeps the worker busy between keystrokes and the held-out runs did not show it paying (the same section of docs/design.md).
    whole_file: bool = False
    # Next-edit suggestions (lsp_server/lsp/nextedit.py, docs/nextedit.md): `ditto/nextEdit` answers the edit that
    # follows the user's, and an inline completion request answers an item that makes it where it lies on the
    # cursor's line, after the cursor. Off: both answer nothing (the editors turn their keys off with it).
    next_edit: bool = True
    # Who proposes `ditto/nextEdit`'s edit (lsp_server/nextedit/__init__.py PROPOSERS): propagate (no model, ~1 ms),
    # rewrite (the model writes the candidate places anew, ~2-3 s of CPU each), both (propagation's proposal shown
    # only where the model's rewrite writes it) or judged (propagation's proposal, or where it has none the places
    # looser rules find, shown only where the model finds the document more likely with it; nextedit/judge.py).
    # Not the default: the model's proposers cost seconds of CPU; on held-out commits rewrite and both are right
    # less often than propagation, judged a little more often with a third fewer wrong (docs/nextedit.md). The
    # inline item at the cursor's line is always propagation's (ghost text cannot wait).
    next_edit_proposer: str = "propagate"
    # The drafter's index of the open buffers, all together, in MB; least recently used ones beyond it are
    # dropped from it and indexed again when visited (completion/buffers.py; ~26 bytes a token).
    index_memory_mb: int = 64
    # What the prompt holds beside the document (docs/design.md, "Definitions and recent edits in the prompt"):
    # the definitions of the names the lines around the cursor use (resolved with jedi in a process of its own,
    # lsp_server/lsp/definitions.py, never on a request's path) and the user's recent edits that bear on the
    # cursor (lsp_server/nextedit/recent.py), as comment lines after the file's head. Each takes at most its share
    # of the prompt budget, in place of as many tokens of the lines above, so a new place costs what it did
    # (completion/extras.py). The defaults are measured (docs/design.md, same section).
    definitions: bool = False  # off: on the tuning repositories they cost characters kept (docs/design.md says how much)
    recent_edits: bool = True
    definitions_share: float = 0.2  # of the prompt budget, at most, for the definitions (0 to 0.5)
    edits_share: float = 0.1  # of the prompt budget, at most, for the recent edits (0 to 0.5)
    # -- while the model loads -----------------------------------------------------------
    load_wait_s: float = 120.0  # a request made while the model loads waits this long for it, then gets null (0 = at once)
    # -- testing (CLI only: `ditto-lsp serve --debug-hooks`) -----------------------------
    debug_hooks: bool = False  # let clients set the debug_* settings below
    debug_step_delay_ms: float = 0.0  # sleep before every model pass (tests make decoding slow to cancel it)
    debug_notify_steps: bool = False  # send a `ditto/debug/step` notification before every model pass
    debug_documents: bool = False  # answer `ditto/debug/document` (the server's text of an open document)
    debug_check_places: bool = False  # answer `ditto/debug/checkPlace` (deadline + continuation against one generation)
    debug_fail_forward: bool = False  # every model pass raises a simulated out-of-memory error after running
    debug_load_delay_s: float = 0.0  # sleep on the worker before the model loads (tests make loading slow; 0 ends it)
    debug_resolve_delay_s: float = 0.0  # sleep in the definitions' process before each job (tests make it slow)

    MODEL_KEYS = ("model", "device", "dtype", "backend", "trust_remote_code", "remote")

    def model_key(self) -> tuple:
        return tuple(getattr(self, k) for k in self.MODEL_KEYS)

    def decode_options(self):
        from lsp_server.decoding.types import DecodeOptions

        return DecodeOptions(max_new_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p,
                             top_k=self.top_k, draft_max=self.draft_max, seed=self.seed,
                             time_budget_s=self.time_budget_s, adaptive=self.adaptive,
                             first_answer_s=self.first_answer_s)

    def completer_settings(self) -> CompleterSettings:
        """The Completer's share of these settings (built here only)."""
        defs = self.definitions_share if self.definitions else 0.0
        edits = self.edits_share if self.recent_edits else 0.0
        return CompleterSettings(drafter=self.drafter, multiline=self.multiline, draft_model=self.draft_model,
                                 budget=ContextBudget.scaled(self.context_tokens, self.snippets, defs, edits)
                                 if self.context_tokens else None, snippets=self.snippets,
                                 whole_file=self.whole_file, show=RULES[self.show], definitions_share=defs,
                                 edits_share=edits)

    # -- the names ---------------------------------------------------------------------------
    @classmethod
    def user_keys(cls) -> tuple[str, ...]:
        """The fields a user sets from an editor or a `serve` flag: all but CLI-only and debug_* ones."""
        return tuple(f.name for f in fields(cls) if f.name not in CLI_ONLY and not f.name.startswith(DEBUG_PREFIX))

    @classmethod
    def field_for(cls, key: str) -> str | None:
        """The field a client's key names (`maxTokens`, `max_tokens`, `timeBudget`), or None."""
        name = _snake(str(key))
        name = ALIASES.get(name, name)
        return name if name in {f.name for f in fields(cls)} else None

    # -- building --------------------------------------------------------------------------
    @classmethod
    def from_cli(cls, args) -> "Settings":
        """From `ditto-lsp serve` arguments (cli.add_model_args / add_decode_args, server_cli).

        Every user key comes from the argument of its own name, except the ones in
        _CLI_DEST (another name) and _CLI_NEGATED (a `--single-line`-style flag).
        """
        options = {}
        for name in cls.user_keys():
            if name in _CLI_NEGATED:
                options[name] = not getattr(args, _CLI_NEGATED[name])
            elif name in _CLI_JSON:
                options[name] = _json_arg(f"--{name}", getattr(args, name, None))
            else:
                options[name] = getattr(args, _CLI_DEST.get(name, name))
        if options["time_budget_s"] is None:  # no --time-budget: the server keeps its default budget
            options["time_budget_s"] = cls.time_budget_s
        if options["context_tokens"] is None:  # no --context-tokens: the default (fitted to the machine)
            options["context_tokens"] = cls.context_tokens
        base = cls(debug_hooks=bool(getattr(args, "debug_hooks", False)))
        if getattr(args, "debug_load_delay", 0.0):
            if not base.debug_hooks:
                raise SettingsError("--debug-load-delay needs --debug-hooks")
            options["debug_load_delay_s"] = args.debug_load_delay
        return base.merged(options)

    def merged(self, options, unknown: list[str] | None = None, refused: list[str] | None = None) -> "Settings":
        """A copy with `options` (a dict from the client) applied; SettingsError if invalid.

        Names of unknown keys are appended to `unknown` when given; names of keys a client
        may not set (CLI-only ones, and debug_* ones unless `debug_hooks`) to `refused`.
        """
        if options is None:
            return self
        if not isinstance(options, dict):
            raise SettingsError(f"settings must be a JSON object, got {type(options).__name__}")
        if isinstance(options.get("ditto"), dict):
            options = {**{k: v for k, v in options.items() if k != "ditto"}, **options["ditto"]}
        changes = {}
        for key, value in options.items():
            name = self.field_for(key)
            if name is None:
                if unknown is not None:
                    unknown.append(str(key))
                continue
            if name in CLI_ONLY or (name.startswith(DEBUG_PREFIX) and not self.debug_hooks):
                if refused is not None:
                    refused.append(str(key))
                continue
            changes[name] = _check(name, value, getattr(type(self), name, None))
        new = dataclasses.replace(self, **changes)
        new.validate()
        return new

    def validate(self) -> None:
        checks = [
            ("drafter", self.drafter in DRAFTERS, f"one of {', '.join(DRAFTERS)}"),
            ("next_edit_proposer", self.next_edit_proposer in PROPOSERS, f"one of {', '.join(PROPOSERS)}"),
            ("show", self.show in SHOW_CHOICES, f"one of {', '.join(SHOW_CHOICES)}"),
            ("draft_model", bool(self.draft_model.strip()), "a non-empty model spec"),
            ("max_tokens", self.max_tokens >= 1, ">= 1"),
            ("context_tokens", self.context_tokens == 0 or self.context_tokens >= 64, "0 (fitted) or >= 64"),
            ("snippets", self.snippets in ContextBudget.SOURCES, ", ".join(ContextBudget.SOURCES[:-1]) + " or "
             + ContextBudget.SOURCES[-1]),
            ("draft_max", self.draft_max >= 0, ">= 0"),
            ("temperature", self.temperature >= 0, ">= 0"),
            ("top_p", 0 < self.top_p <= 1, "in (0, 1]"),
            ("top_k", self.top_k >= 0, ">= 0"),
            ("time_budget_s", self.time_budget_s is None or self.time_budget_s > 0, "> 0 or null"),
            ("first_answer_s", self.first_answer_s is None or self.first_answer_s >= 0, ">= 0 or null"),
            ("debug_step_delay_ms", 0 <= self.debug_step_delay_ms <= 10_000, "in [0, 10000]"),
            ("load_wait_s", 0 <= self.load_wait_s <= 86_400, "in [0, 86400]"),
            ("index_memory_mb", 1 <= self.index_memory_mb <= 1 << 20, "in [1, 1048576]"),
            ("debug_load_delay_s", 0 <= self.debug_load_delay_s <= 86_400, "in [0, 86400]"),
            ("debug_resolve_delay_s", 0 <= self.debug_resolve_delay_s <= 600, "in [0, 600]"),
            ("definitions_share", 0 <= self.definitions_share <= 0.5, "in [0, 0.5]"),
            ("edits_share", 0 <= self.edits_share <= 0.5, "in [0, 0.5]"),
            ("model", bool(self.model.strip()), "a non-empty model spec"),
            ("backend", self.backend in BACKENDS, ", ".join(BACKENDS[:-1]) + " or " + BACKENDS[-1]),
        ]
        for name, ok, want in checks:
            if not ok:
                raise SettingsError(f"setting {name!r} must be {want}, got {getattr(self, name)!r}")
        if not self.debug_hooks:
            for f in fields(self):
                if f.name.startswith(DEBUG_PREFIX) and getattr(self, f.name) != f.default:
                    raise SettingsError(f"setting {f.name!r} needs `ditto-lsp serve --debug-hooks`")


# `serve` argument (argparse dest) of a user key where it is not the key's own name.
_CLI_DEST = {"time_budget_s": "time_budget"}
_CLI_JSON = ("remote",)  # a JSON object on the command line
_CLI_NEGATED = {"multiline": "single_line", "adaptive": "no_adaptive", "idle_prefill": "no_idle_prefill",
                "next_edit": "no_next_edit", "learn_show": "no_learn_show", "recent_edits": "no_recent_edits"}  # key = not args.<flag>


_TYPES = {
    "model": str, "device": str, "dtype": str, "backend": str, "drafter": str, "draft_model": str, "snippets": str,
    "next_edit_proposer": str, "show": str, "learn_show": bool,
    "trust_remote_code": bool, "multiline": bool, "adaptive": bool, "idle_prefill": bool, "whole_file": bool, "next_edit": bool,
    "debug_hooks": bool,
    "debug_notify_steps": bool, "debug_documents": bool, "debug_check_places": bool, "debug_fail_forward": bool,
    "max_tokens": int, "context_tokens": int, "draft_max": int, "top_k": int, "seed": (int, type(None)),
    "temperature": float, "top_p": float, "time_budget_s": (float, type(None)), "first_answer_s": (float, type(None)), "debug_step_delay_ms": float,
    "load_wait_s": float, "debug_load_delay_s": float, "index_memory_mb": int,
    "definitions": bool, "recent_edits": bool, "definitions_share": float, "edits_share": float,
    "debug_resolve_delay_s": float,
    "remote": dict,
}


def _json_arg(flag: str, text: str | None) -> dict:
    if not text:
        return {}
    try:
        return json.loads(text)
    except ValueError as err:
        raise SettingsError(f"{flag} must be a JSON object: {err}") from None


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def _check(name: str, value, default):
    want = _TYPES[name]
    wants = want if isinstance(want, tuple) else (want,)
    if isinstance(value, bool) and bool not in wants:
        raise SettingsError(f"setting {name!r} must be a {wants[0].__name__}, got {value!r}")
    if float in wants and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, wants):
        shown = "{...}" if name == "remote" else repr(value)
        raise SettingsError(f"setting {name!r} must be a {wants[0].__name__}, got {shown}")
    if name == "remote":
        from lsp_server.backends.remote.transport import check_remote_setting

        try:
            return check_remote_setting(value)
        except ValueError as err:  # the message names keys, never header values
            raise SettingsError(f"setting 'remote': {err}") from None
    return value
