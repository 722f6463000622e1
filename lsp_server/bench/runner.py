"""Run the systems over harvested tasks and produce per-task records (see metrics.py).

Completion mode runs every system on one task before the next task, on the same prompt
and token budget: `off` first (it prefills the prompt under the task's cache key and is
the reference), then the other Ditto systems (reusing that prefill), then the
transformers systems (budget = the tokens `off` generated). Keystroke mode types the
ground truth one character at a time and requests a completion after each keystroke.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterator

from . import metrics
from .systems import DITTO, fixed_k, generated_ids, run_ditto, run_hf


def same_output(run, ref) -> bool:
    """Same suggestion as `off`, token for token up to where the stop rules cut.

    The engine applies the Completer's stop rule after each round, so a system that gains
    several tokens per pass may return a few tokens past the point where `off` stopped;
    those never reach the user (the ghost-text rules cut them). So: equal text, and one
    token list a prefix of the other.
    """
    n = min(len(run.tokens), len(ref.tokens))
    return run.text == ref.text and run.tokens[:n] == ref.tokens[:n]


class Bench:
    def __init__(self, lm, completer, options, lookup_tokens: int = 10):
        self.lm = lm
        self.completer = completer
        self.options = options
        self.lookup_tokens = lookup_tokens

    # -- warm-up ---------------------------------------------------------------------------
    def warm_up(self, task, systems: list[str], mode: str) -> None:
        """Run each system once on a short budget (results discarded)."""
        short = replace(self.options, max_new_tokens=min(4, self.options.max_new_tokens))
        ref = None
        for s in systems:
            base = s.removesuffix("-noreuse")
            if base in DITTO or fixed_k(base):
                _, sug = run_ditto(self.completer, task, base, short, None, reference=ref)
                ref = sug if base == "off" else ref
            elif ref is not None:
                run_hf(self.lm, ref.prompt.ids, s, 4, self.lookup_tokens)
        self.completer.engine.clear_cache()

    # -- completion mode --------------------------------------------------------------------
    def completion_task(self, task, systems: list[str]) -> list[dict]:
        key = f"bench:{task.id}"
        base = {"task": task.id, "copyable": task.copyable, "copyable_buffers": task.copyable_buffers,
                "truth_lines": task.truth.count("\n") + 1}
        records = []
        ref = None
        ref_run = None
        try:
            for s in systems:
                if s in DITTO or fixed_k(s):
                    run, sug = run_ditto(self.completer, task, s, self.options, key, reference=ref)
                    if s == "off":
                        ref, ref_run = sug, run
                    else:
                        # Comparable end-to-end latency: the task's prefill (done once, by off) + own decode.
                        run.prefill_ms = ref_run.prefill_ms
                        run.latency_ms = ref_run.prefill_ms + run.decode_ms
                else:
                    budget = len(generated_ids(ref.completion))
                    _, run = run_hf(self.lm, ref.prompt.ids, s, budget, self.lookup_tokens)
                    from ..context import finish

                    run.text = finish(self.lm.decode(run.tokens), ref.prompt, self.completer.settings.multiline)
                rec = {**base, "system": s, **run.as_dict(), "raw": self.lm.decode(run.tokens)}
                if s == "off":  # the prompt, so that drafting policies can be replayed offline on off's tokens
                    rec["prompt_ids"] = list(ref.prompt.ids)
                rec["identical"] = same_output(run, ref_run)
                if s != "off" and not rec["identical"]:
                    rec["reference_text"] = ref_run.text
                rec.update(metrics.quality(run.text, task.truth))
                records.append(rec)
        finally:
            self.completer.engine.forget(key)
        return records

    # -- keystroke mode ---------------------------------------------------------------------
    def keystroke_task(self, task, systems: list[str], max_keystrokes: int | None,
                       on_request: Callable[[], None] | None = None) -> Iterator[dict]:
        """One record per request: the empty block first, then after each typed character."""
        n = len(task.truth) if max_keystrokes is None else min(len(task.truth), max_keystrokes)
        for s in systems:
            base = s.removesuffix("-noreuse")
            key = None if s.endswith("-noreuse") else f"doc:{task.path}"
            try:
                for i in range(n + 1):
                    text, line, col = task.typed(i)
                    run, sug = run_ditto(self.completer, task, base, self.options, key, text=text, line=line, col=col)
                    rec = {"task": task.id, "system": s, "keystroke": i, "copyable": task.copyable,
                           "tts_ms": round(run.latency_ms, 2), "typethrough": bool(getattr(sug, "typethrough", False)),
                           **run.as_dict()}
                    if on_request:
                        on_request()
                    yield rec
            finally:
                if key is not None:
                    self.completer.engine.forget(key)
