"""The `ditto-lsp` command: serve, complete, trace, models, and the tools' bench.

Everything a user can do from the editor they can do from here, which is how bugs get
reported and benchmarks reproduced. Each subcommand is a module with `configure(parser)`
and `run(args) -> int`. The product's are lsp_server/commands/. The tools installed beside
the server (ditto_bench: `bench`) bring theirs as entry points of the group `ditto_lsp.commands`
(pyproject.toml), read with importlib.metadata and loaded only when their command is the one
asked for: the product never imports the tools, and without them `ditto-lsp bench` says so in one
line. Modules stay light at import time (no torch, pygls or transformers until `run`), so `--help`
is quick.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from lsp_server.commands import complete, models, serve, trace

# Subcommand -> (module holding configure(parser) and run(args), help).
SUBCOMMANDS = {
    "complete": (complete, "print one completion for FILE:LINE:COL (1-based)"),
    "serve": (serve, "run the language server (stdio, or loopback TCP)"),
    "trace": (trace, "show one completion's propose/verify rounds"),
    "models": (models, "list models, install a packaged one, or show the cache directory"),
}
# The entry-point group of the tools' commands, and the ones known here by name and help, so that
# `--help` lists them without importing the tools and a missing one is named as such.
TOOL_GROUP = "ditto_lsp.commands"
TOOLS = {"bench": "benchmark on real commits of a git repository"}


def tool_command(name: str):
    """The module of the tools' command `name` (an entry point of TOOL_GROUP), else the one line that
    says why it is not there."""
    from importlib import metadata

    found = [ep for ep in metadata.entry_points(group=TOOL_GROUP) if ep.name == name]
    why = "its entry point is not registered"
    if found:
        try:
            return found[0].load()
        except ImportError as err:
            why = f"it does not import: {err}"
    return (f"ditto-lsp: {name} is one of the benchmark tools (ditto_bench), not installed here ({why} in "
            f"{TOOL_GROUP}); from a checkout, pip install -e . installs them")


def _asked(argv: list[str]) -> str | None:
    """The subcommand on a command line: its first word that is not an option."""
    return next((w for w in argv if not w.startswith("-")), None)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser. `argv`: the command line it will parse, so that a tool's command is loaded only
    when it is the one asked for; None loads every one (what lists all options)."""
    from importlib import metadata

    parser = argparse.ArgumentParser(prog="ditto-lsp", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages to stderr")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_)
        module.configure(p)
        p.set_defaults(func=module.run)
    asked = None if argv is None else _asked(argv)
    registered = [ep.name for ep in metadata.entry_points(group=TOOL_GROUP) if ep.name not in SUBCOMMANDS]
    for name in dict.fromkeys([*TOOLS, *registered]):
        module = tool_command(name) if argv is None or name == asked else None
        help_ = TOOLS.get(name) or f"a tool's command ({name})"
        if module is None or isinstance(module, str):  # not asked for, or not there (`module` says why)
            sub.add_parser(name, help=help_, description=module).set_defaults(func=None, unavailable=module)
        else:
            p = sub.add_parser(name, help=help_)
            module.configure(p)
            p.set_defaults(func=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args, unknown = parser.parse_known_args(argv)
    if args.func is None:  # a tool's command that is not installed: its options are unknown, so say only that
        print(args.unavailable, file=sys.stderr)
        return 2
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
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
