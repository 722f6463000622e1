"""The server's settings: one dataclass, built from CLI flags, then the client's options.

Sources, later ones override earlier ones: the defaults below, `ditto-lsp serve` flags,
`initializationOptions`, and every `workspace/didChangeConfiguration`. The client may
send the options flat or under a "ditto" key, in snake_case or camelCase
(`maxTokens` == `max_tokens`). Unknown keys are ignored with a warning; a value of the
wrong type or out of range raises SettingsError with one line naming the key.

Left out on purpose: pygls, torch (this module is imported by the CLI before either).
"""

from __future__ import annotations

import dataclasses
import re
import json
from dataclasses import dataclass, field, fields


class SettingsError(ValueError):
    """A client or CLI option has the wrong type or is out of range."""


@dataclass(frozen=True)
class Settings:
    # -- model (changing any of these reloads the model) -------------------------------
    model: str = "default"  # default | qwen2.5-coder-0.5b | tiny-random | FILE.gguf | DIR | hub id
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    backend: str = "auto"  # auto | torch | llama.cpp (lsp_server/model.py choose_backend)
    trust_remote_code: bool = False  # let a model directory's own Python code run
    # A remote engine's transport (model = http[s]://HOST:PORT/v1#NAME; docs/team.md): {"headers": {...}
    # (never logged; values may use ${DITTO_*} variables), "caFile", "certFile", "keyFile", "body": {extra
    # request fields}, "connectTimeoutS"}. Not in repr: the headers carry credentials.
    remote: dict = field(default_factory=dict, repr=False)
    # -- decoding ------------------------------------------------------------------------
    drafter: str = "ngram"  # none | ngram | model | hybrid
    draft_model: str = "qwen2.5-coder-0.5b"  # model spec of the model / hybrid drafters (same tokenizer as model)
    max_tokens: int = 64  # token budget of one suggestion
    draft_max: int = 8  # longest draft verified in one pass; 0 = plain decoding
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    time_budget_s: float | None = 5.0  # stop decoding after this long (None = no limit)
    multiline: bool = True  # ghost text may span lines (until the current block ends)
    # -- testing -------------------------------------------------------------------------
    debug_step_delay_ms: float = 0.0  # sleep before every model pass (tests make decoding slow to cancel it)
    debug_notify_steps: bool = False  # send a `ditto/debug/step` notification before every model pass
    debug_documents: bool = False  # answer `ditto/debug/document` (the server's text of an open document)
    debug_fail_forward: bool = False  # every model pass raises a simulated out-of-memory error after running

    MODEL_KEYS = ("model", "device", "dtype", "backend", "trust_remote_code", "remote")

    def model_key(self) -> tuple:
        return tuple(getattr(self, k) for k in self.MODEL_KEYS)

    def decode_options(self):
        from .engine import DecodeOptions

        return DecodeOptions(max_new_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p,
                             top_k=self.top_k, draft_max=self.draft_max, seed=self.seed,
                             time_budget_s=self.time_budget_s)

    # -- building --------------------------------------------------------------------------
    @classmethod
    def from_cli(cls, args) -> "Settings":
        """From `ditto-lsp serve` arguments (cli.add_model_args / add_decode_args)."""
        return cls().merged({
            "model": args.model, "device": args.device, "dtype": args.dtype,
            "backend": getattr(args, "backend", cls.backend),
            "trust_remote_code": args.trust_remote_code, "drafter": args.drafter,
            "draft_model": getattr(args, "draft_model", cls.draft_model), "max_tokens": args.max_tokens,
            "draft_max": args.draft_max, "temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
            "seed": args.seed, "time_budget_s": args.time_budget if args.time_budget is not None else cls.time_budget_s,
            "multiline": not args.single_line, "remote": _json_arg("--remote", getattr(args, "remote", None)),
        })

    def merged(self, options, unknown: list[str] | None = None) -> "Settings":
        """A copy with `options` (a dict from the client) applied; SettingsError if invalid.

        Names of ignored keys are appended to `unknown` when given.
        """
        if options is None:
            return self
        if not isinstance(options, dict):
            raise SettingsError(f"settings must be a JSON object, got {type(options).__name__}")
        if isinstance(options.get("ditto"), dict):
            options = {**{k: v for k, v in options.items() if k != "ditto"}, **options["ditto"]}
        known = {f.name: f for f in fields(self)}
        changes = {}
        for key, value in options.items():
            name = _snake(str(key))
            if name == "time_budget":
                name = "time_budget_s"
            if name not in known:
                if unknown is not None:
                    unknown.append(str(key))
                continue
            changes[name] = _check(name, value, getattr(type(self), name, None))
        new = dataclasses.replace(self, **changes)
        new.validate()
        return new

    def validate(self) -> None:
        checks = [
            ("drafter", self.drafter in ("none", "ngram", "model", "hybrid"), "none, ngram, model or hybrid"),
            ("draft_model", bool(self.draft_model.strip()), "a non-empty model spec"),
            ("max_tokens", self.max_tokens >= 1, ">= 1"),
            ("draft_max", self.draft_max >= 0, ">= 0"),
            ("temperature", self.temperature >= 0, ">= 0"),
            ("top_p", 0 < self.top_p <= 1, "in (0, 1]"),
            ("top_k", self.top_k >= 0, ">= 0"),
            ("time_budget_s", self.time_budget_s is None or self.time_budget_s > 0, "> 0 or null"),
            ("debug_step_delay_ms", 0 <= self.debug_step_delay_ms <= 10_000, "in [0, 10000]"),
            ("model", bool(self.model.strip()), "a non-empty model spec"),
            ("backend", self.backend in ("auto", "torch", "llama.cpp"), "auto, torch or llama.cpp"),
        ]
        for name, ok, want in checks:
            if not ok:
                raise SettingsError(f"setting {name!r} must be {want}, got {getattr(self, name)!r}")


_TYPES = {
    "model": str, "device": str, "dtype": str, "backend": str, "drafter": str, "draft_model": str,
    "trust_remote_code": bool, "multiline": bool, "debug_notify_steps": bool,
    "debug_documents": bool, "debug_fail_forward": bool,
    "max_tokens": int, "draft_max": int, "top_k": int, "seed": (int, type(None)),
    "temperature": float, "top_p": float, "time_budget_s": (float, type(None)), "debug_step_delay_ms": float,
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
        from .remote_backend import check_remote_setting

        try:
            return check_remote_setting(value)
        except ValueError as err:  # the message names keys, never header values
            raise SettingsError(f"setting 'remote': {err}") from None
    return value
