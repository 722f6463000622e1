"""`ditto-lsp serve`: run the language server on stdio, or on a loopback TCP port.

Kept light at import time (the CLI imports it to build its parser): pygls and torch are
imported inside run(). stdout carries the protocol, so logs go to stderr or --log-file.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys


def configure(p: argparse.ArgumentParser) -> None:
    from lsp_server.commands.options import add_decode_args, add_model_args
    from lsp_server.nextedit import PROPOSERS
    from lsp_server.settings import Settings

    p.description = ("Run the language server. Speaks LSP on stdin/stdout unless --tcp is given. "
                     "Every model and decoding option here can also be set by the editor as initializationOptions "
                     "or workspace/didChangeConfiguration settings (e.g. {\"model\": \"tiny-random\", "
                     "\"maxTokens\": 32}); --debug-hooks cannot.")
    g = p.add_argument_group("transport")
    g.add_argument("--stdio", action="store_true", help="speak LSP on stdin/stdout (the default)")
    g.add_argument("--tcp", type=int, metavar="PORT", default=None,
                   help="listen on TCP PORT instead of stdio; binds 127.0.0.1 (loopback only) unless --host is given")
    g.add_argument("--host", default=None,
                   help="address to bind with --tcp (default 127.0.0.1; anything else exposes the server "
                        "and your open files to the network)")
    g.add_argument("--log-file", default=None, metavar="PATH", help="also write the log to PATH (it always goes to stderr)")
    add_model_args(p)
    add_decode_args(p)
    srv = p.add_argument_group("server")
    srv.add_argument("--no-idle-prefill", action="store_true",
                     help="do not prefill the likely next prompt, nor generate its suggestion, while the editor is idle "
                          "(on by default)")
    srv.add_argument("--whole-file", dest="whole_file", action="store_true",
                     help="the whole file above the cursor from a warm KV per open file, filled while the editor is "
                          "idle (off by default; docs/design.md, \"The whole file above the cursor\")")
    srv.add_argument("--no-learn-show", action="store_true",
                     help="keep the --show limit as it is instead of moving it, a little, by what you keep and what you "
                          "type over (on by default; lsp_server/lsp/shown.py)")
    srv.add_argument("--no-next-edit", action="store_true",
                     help="no next-edit suggestions: `ditto/nextEdit` and the inline item that makes the next edit on "
                          "the cursor's line answer nothing (on by default; docs/nextedit.md)")
    srv.add_argument("--next-edit-proposer", default=Settings.next_edit_proposer, choices=PROPOSERS,
                     help="who proposes ditto/nextEdit's edit: propagate (no model), rewrite (the model writes the "
                          "candidate places anew) or both (propagation's proposal where the model's rewrite agrees); "
                          f"default {Settings.next_edit_proposer} (docs/nextedit.md says why)")
    srv.add_argument("--first-answer", dest="first_answer_s", type=_seconds_or_none, default=Settings.first_answer_s,
                     metavar="SECONDS|none",
                     help="answer with the first complete line, or after this long decoding, and generate the rest "
                          f"while the editor is idle (default {Settings.first_answer_s}; none = answer when the whole "
                          "suggestion is there)")
    srv.add_argument("--definitions", dest="definitions", action="store_true",
                     help="the definitions of the names used around the cursor in the prompt, resolved with jedi in a "
                          "process of its own (off by default: at a CPU's prompt budget they cost more of the lines "
                          "above than they gave; docs/design.md, \"Definitions and recent edits in the prompt\")")
    srv.add_argument("--no-recent-edits", action="store_true",
                     help="no recent edits in the prompt (your changes elsewhere that share a name with the lines "
                          "around the cursor; on by default)")
    srv.add_argument("--definitions-share", type=float, default=Settings.definitions_share, metavar="FRACTION",
                     help="of the prompt budget, at most, for the definitions, taken from the lines above "
                          f"(0 to 0.5, default {Settings.definitions_share})")
    srv.add_argument("--edits-share", type=float, default=Settings.edits_share, metavar="FRACTION",
                     help="of the prompt budget, at most, for the recent edits, taken from the lines above "
                          f"(0 to 0.5, default {Settings.edits_share})")
    srv.add_argument("--index-memory-mb", type=int, default=Settings.index_memory_mb, metavar="MB",
                     help="memory for the drafter's index of the open buffers, all together; the least recently "
                          f"used beyond it are dropped and indexed again when visited (default {Settings.index_memory_mb})")
    srv.add_argument("--load-wait", dest="load_wait_s", type=float, default=Settings.load_wait_s, metavar="SECONDS",
                     help="how long a completion request made while the model loads waits for it; then it is "
                          "answered null (default 120; 0 = at once)")
    t = p.add_argument_group("testing")
    t.add_argument("--debug-hooks", action="store_true",
                   help="let the client set the debug* settings (test hooks: slowed or failing model passes, "
                        "ditto/debug/document); off, they are ignored with a warning. Never needed in an editor")
    t.add_argument("--debug-load-delay", type=float, default=0.0, metavar="SECONDS",
                   help="with --debug-hooks: sleep this long before the model loads (the debug_load_delay_s setting; "
                        "editor tests make requests while the model loads)")


def _seconds_or_none(text: str) -> float | None:
    if text.strip().lower() in ("none", "null"):
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds or none, got {text!r}") from None


def run(args) -> int:
    from lsp_server.settings import Settings, SettingsError

    if args.host is not None and args.tcp is None:
        raise SystemExit("ditto-lsp: error: --host needs --tcp PORT")
    if args.tcp is not None and not 0 < args.tcp < 65536:
        raise SystemExit(f"ditto-lsp: error: --tcp PORT must be in 1..65535, got {args.tcp}")
    if args.log_file:
        handler = logging.FileHandler(args.log_file, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(handler)
    if not getattr(args, "verbose", False):
        logging.getLogger("lsp_server").setLevel(logging.INFO)
    try:
        settings = Settings.from_cli(args)
    except SettingsError as err:
        raise SystemExit(f"ditto-lsp: error: {err}") from None

    from lsp_server.lsp.server import build_server

    server = build_server(settings)
    try:
        if args.tcp is not None:
            host = args.host or "127.0.0.1"
            logging.getLogger(__name__).warning("listening on %s:%d", host, args.tcp)
            server.start_tcp(host, args.tcp)
        else:
            server.start_io(sys.stdin.buffer, sys.stdout.buffer)
    finally:
        server.service.close(timeout=10)  # sets the running generation's stop flag; it ends within one pass
    # LSP: exit code 0 after a shutdown request, 1 otherwise (pygls's own sys.exit(1) is
    # raised inside an event-loop callback and lost).
    code = 0 if server.protocol.shut_down else 1
    # Leave without interpreter finalization: a daemon thread still inside a torch call (a
    # model load cannot be interrupted) made finalization abort (SIGABRT, exit -6) when the
    # client went away mid-generation.
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
