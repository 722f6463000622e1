"""The command line's shared options and helpers: model and decoding flags, loading a model
with progress on stderr, FILE:LINE:COL positions, reading files, and preparing a completion.

Used by every subcommand in lsp_server/commands/; `serve` turns the same flags into the
server's Settings (lsp_server/settings.py `Settings.from_cli`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from drafters.registry import DRAFTERS
from lsp_server.backends.loader import BACKENDS
from lsp_server.completion.context import ContextBudget
from lsp_server.completion.show import SHOW_CHOICES
from lsp_server.settings import Settings, SettingsError


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", default=Settings.model, metavar="SPEC",
                   help="default | qwen2.5-coder-0.5b | qwen2.5-coder-1.5b | tiny-random | FILE.gguf | ollama:NAME[:TAG] | "
                        "DIR | hub id | http[s]://HOST:PORT/v1#NAME (a remote engine, docs/team.md)")
    g.add_argument("--backend", default=os.environ.get("DITTO_BACKEND") or Settings.backend,
                   choices=BACKENDS,
                   help="where the model runs: llama.cpp (GGUF as it is, CPU), torch (transformers; GPU or float32), "
                        "auto = llama.cpp for a GGUF model on the CPU when installed, else torch "
                        "(default: $DITTO_BACKEND, else auto)")
    g.add_argument("--device", default=Settings.device, help="auto (CUDA if present, else CPU), cpu, cuda, cuda:N")
    g.add_argument("--dtype", default=Settings.dtype,
                   help="auto (bf16 on CUDA, float32 on CPU), float32, bfloat16, float16")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="allow a model directory's own Python code to run (off by default)")
    g.add_argument("--remote", default=None, metavar="JSON",
                   help='transport of a remote engine (--model http://HOST:PORT/v1#NAME): JSON like '
                        '{"headers": {"Authorization": "Bearer ${DITTO_TOKEN}"}, "caFile": "ca.pem", "body": {...}}; '
                        'see docs/team.md')


def add_decode_args(p: argparse.ArgumentParser) -> None:
    """The decoding flags; `serve` turns them into Settings (Settings.from_cli), with its defaults."""
    g = p.add_argument_group("decoding")
    g.add_argument("--drafter", default=Settings.drafter, choices=DRAFTERS,
                   help="draft source: none = plain decoding, ngram = lookup in the open buffers, model = a small "
                        "draft model, hybrid = ngram where it has a confident match, else the model (default ngram)")
    g.add_argument("--draft-model", default=Settings.draft_model, metavar="SPEC",
                   help="draft model of --drafter model|hybrid; same tokenizer as --model (default qwen2.5-coder-0.5b)")
    g.add_argument("--max-tokens", type=int, default=Settings.max_tokens,
                   help="token budget of the completion (default 64)")
    g.add_argument("--context-tokens", type=int, default=None, metavar="N",
                   help="prompt budget in tokens (default 0: fitted to this machine when the model loads, 256-2048; "
                        "bench: 1024 in completion and keystroke mode, the server's default in session mode)")
    g.add_argument("--snippets", default=Settings.snippets, choices=ContextBudget.SOURCES,
                   help="what of the other open buffers the prompt holds: heads = each one's start (from a "
                        "--context-tokens of 1024 on), similar = their chunks most like the code above the cursor, "
                        f"none (default {Settings.snippets})")
    g.add_argument("--draft-max", type=int, default=Settings.draft_max,
                   help="longest draft verified in one pass (default 8)")
    g.add_argument("--temperature", type=float, default=Settings.temperature, help="0 = greedy (default)")
    g.add_argument("--top-p", type=float, default=Settings.top_p)
    g.add_argument("--top-k", type=int, default=Settings.top_k)
    g.add_argument("--seed", type=int, default=Settings.seed, help="sampling seed")
    g.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="stop decoding after this long (serve: default 5; the other commands: no limit)")
    g.add_argument("--single-line", action="store_true", help="stop at the end of the first line")
    g.add_argument("--show", default=Settings.show, choices=SHOW_CHOICES,
                   help="what of a suggestion is shown: all, sure (up to where the model becomes unsure, nothing when "
                        f"it is unsure from the start) or surest (default {Settings.show}; docs/design.md, \"What to show\")")
    g.add_argument("--no-adaptive", action="store_true",
                   help="verify every drafted token (k = --draft-max) instead of choosing k from measured pass costs")


def decode_options(args):
    """The decoding options of the flags: the server's own mapping (settings.py `Settings.decode_options`),
    range-checked by the settings' rules. The command line answers once, in full: no first-line
    deadline (`first_answer_s` is for an editor that shows the first line while the rest comes),
    and no time limit unless `--time-budget` sets one."""
    try:
        settings = Settings().merged({"max_tokens": args.max_tokens, "draft_max": args.draft_max,
                                      "temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
                                      "seed": args.seed, "time_budget_s": args.time_budget,
                                      "adaptive": not getattr(args, "no_adaptive", False), "first_answer_s": None})
    except SettingsError as err:
        raise SystemExit(f"ditto-lsp: error: {err}") from None
    return settings.decode_options()


def stderr_progress(quiet: bool = False):
    def say(msg: str, frac) -> None:
        if quiet:
            return
        if frac is not None and frac < 1.0:
            print(f"\r\033[K{msg}: {frac * 100:5.1f}%", end="", file=sys.stderr, flush=True)
        else:
            print(f"\r\033[K{msg}", file=sys.stderr, flush=True)

    return say


def load_model(args, quiet: bool = False):
    from lsp_server.backends.base import ModelError
    from lsp_server.backends.loader import load

    try:
        return load(args.model, device=args.device, dtype=args.dtype, trust_remote_code=args.trust_remote_code,
                    backend=getattr(args, "backend", "auto"), progress=stderr_progress(quiet),
                    remote=remote_arg(args))
    except ModelError as err:
        raise SystemExit(f"ditto-lsp: {err}") from None


def remote_arg(args) -> dict:
    """--remote JSON, checked as the `remote` setting is."""
    if not getattr(args, "remote", None):
        return {}
    try:
        return Settings().merged({"remote": json.loads(args.remote)}).remote
    except ValueError as err:  # SettingsError, or JSON that does not parse
        raise SystemExit(f"ditto-lsp: error: --remote: {err}") from None


def parse_position(spec: str) -> tuple[Path, int, int]:
    """FILE:LINE:COL (1-based, as compilers print them) -> (path, line0, col0)."""
    parts = spec.rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        raise SystemExit(f"ditto-lsp: error: expected FILE:LINE:COL (1-based), got {spec!r}")
    path, line, col = Path(parts[0]), int(parts[1]), int(parts[2])
    if line < 1 or col < 1:
        raise SystemExit(f"ditto-lsp: error: LINE and COL are 1-based, got {line}:{col}")
    return path, line - 1, col - 1


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SystemExit(f"ditto-lsp: error: no such file: {path}") from None
    except (UnicodeDecodeError, IsADirectoryError, PermissionError) as err:
        raise SystemExit(f"ditto-lsp: error: cannot read {path} as UTF-8 text: {err}") from None


def prepare_completion(args):
    """Shared by complete and trace: load, read, index the open buffers; returns (lm, completer, text, line, col, path)."""
    from lsp_server.backends.base import ModelError
    from lsp_server.completion.build import build_completer
    from lsp_server.completion.context import split_at

    path, line, col = parse_position(args.position)
    text = read_text(path)
    try:
        split_at(text, line, col)
    except ValueError as err:
        raise SystemExit(f"ditto-lsp: error: {path}:{line + 1}:{col + 1}: {err}") from None
    lm = load_model(args, quiet=getattr(args, "json", False))
    settings = Settings().merged({"drafter": args.drafter, "multiline": not args.single_line,
                                  "draft_model": args.draft_model,
                                  "context_tokens": args.context_tokens or Settings.context_tokens,
                                  "snippets": args.snippets, "show": args.show}).completer_settings()
    # Pass costs for the adaptive draft length (stored after the first run), only where drafts are priced.
    calibration = "stored" if args.drafter != "none" and not getattr(args, "no_adaptive", False) else None
    buffers = [(str(other), read_text(Path(other))) for other in args.open or []]
    try:
        completer = build_completer(lm, settings, calibration=calibration, buffers=buffers, drafter=args.drafter)
    except (ModelError, ValueError) as err:  # TokenizerMismatch is a ValueError
        raise SystemExit(f"ditto-lsp: draft model: {err}") from None
    return lm, completer, text, line, col, path
