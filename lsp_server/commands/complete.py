"""`ditto-lsp complete FILE:LINE:COL`: one completion, printed (or one JSON object with `--json`)."""

from __future__ import annotations

import argparse
import json
import sys

from lsp_server.commands.options import add_decode_args, add_model_args, decode_options, prepare_completion


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("position", metavar="FILE:LINE:COL")
    p.add_argument("--open", action="append", metavar="PATH", help="another open buffer for the drafter (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object with the text and statistics")
    add_model_args(p)
    add_decode_args(p)


def run(args) -> int:
    lm, completer, text, line, col, path = prepare_completion(args)
    sug = completer.complete(text, line, col, name=str(path), options=decode_options(args))
    summary = {**sug.summary(lm.spec), **completer.budget_report()}
    if args.json:
        print(json.dumps(summary, ensure_ascii=False))
    else:
        print(sug.text)
        if sug.withheld:
            print(f"-- not shown (--show {args.show}: the model was unsure from there): {sug.withheld!r}",
                  file=sys.stderr)
        s = sug.completion.stats
        print(f"-- {s.tokens} tokens in {s.target_passes} target passes, {s.accepted}/{s.drafted} drafts accepted, "
              f"prefill {s.prefill_tokens} tokens {s.prefill_ms:.0f} ms, total {sug.latency_ms:.0f} ms "
              f"({lm.spec}, drafter {sug.drafter}, prompt budget {completer.budget.total} tokens, "
              f"stop: {s.stop_reason})", file=sys.stderr)
    return 0
