"""`ditto-lsp trace FILE:LINE:COL`: one completion, shown one propose/verify round at a time.

For each round: the tokens the drafter proposed, which of them the target model accepted
(green), which it rejected (red, struck through), the token the target added itself (a
correction after a rejection, a bonus after a fully accepted draft, or a plain decode
step without a draft), and how many tokens that one target pass bought. `--html OUT`
writes the same as a self-contained page; `--json` prints the data.

The data and both views live in lsp_server/completion/rounds.py (the server's `ditto/trace` uses
them too); this module is the command. Top level stays light (no torch): the model is
loaded by `run` only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lsp_server.completion.rounds import TRACE_VERSION, render_html, render_terminal, trace_data  # noqa: F401  (re-exported)


def configure(p: argparse.ArgumentParser) -> None:
    from lsp_server.commands.options import add_decode_args, add_model_args

    p.add_argument("position", metavar="FILE:LINE:COL")
    p.add_argument("--open", action="append", metavar="PATH", help="another open buffer for the drafter (repeatable)")
    p.add_argument("--html", type=Path, metavar="OUT", help="also write a self-contained HTML page")
    p.add_argument("--json", action="store_true", help="print the trace data as JSON instead of the coloured view")
    add_model_args(p)
    add_decode_args(p)


def run(args) -> int:
    from lsp_server.commands.options import decode_options, prepare_completion

    opts = decode_options(args)
    lm, completer, text, line, col, path = prepare_completion(args)
    sug = completer.complete(text, line, col, name=str(path), options=opts)
    data = trace_data(sug.completion, lm.token_text, text=sug.text, model=lm.spec, drafter=sug.drafter)
    if args.json:
        print(json.dumps(data, ensure_ascii=False))
    else:
        render_terminal(data)
    if args.html:
        args.html.write_text(render_html(data, title=f"Ditto trace: {path}:{line + 1}:{col + 1}"), encoding="utf-8")
        print(f"wrote {args.html}", file=sys.stderr)
    return 0
