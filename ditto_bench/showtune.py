"""What to show, fitted and judged offline on editor replays (lsp_server/completion/show.py).

    python -m ditto_bench.showtune RESULTS.json [RESULTS.json ...] [--fit] [--system ditto]

Reads editor-replay results (`ditto-lsp bench --mode session`, a Ditto system that shows everything,
one results.json per repository) whose records carry how sure the model was of each token (`sure`:
the trace's [text, probability, lead] per token, lsp_server/lsp/worker/state.py), and cuts each
recorded answer as the server would (show.py `shown_length`), scoring it against what the user typed
next (quality.py: wrong, characters kept, first lines right).

- Without `--fit`: every rule of show.py's RULES, and a row of limits, with show.py's WEIGHTS.
- With `--fit`: fits the hazard model (show.py `features`: does the suggestion go wrong at this
  token, given it was right before it; a logistic regression, Newton's method, a little L2) leaving
  one repository out at a time, prints how each limit does on the repository left out against
  showing everything, and the weights fitted on all of them: how WEIGHTS and RULES were chosen, on
  tuning repositories only (docs/design.md, "What to show").

Answers without token data (type-through, an older trace) count as shown whole. Left out on purpose:
running the replays (cli.py) and the held-out judgement (a benchmark run beside the peer).
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np

from ditto_bench.quality import first_line_exact, keep_quality
from lsp_server.completion.show import RULES, WEIGHTS, ShowRule, features, shown_length

LIMITS = (0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7)


def records(path: str, system: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return [r for r in data["tasks"] if r.get("system") == system and not r.get("timeout")]


def tokens(record: dict) -> tuple[list[str], list[float], list[float], int] | None:
    """(pieces, probabilities, leads, where the shown text starts in them) of a record, or None."""
    text, sure = record.get("text") or "", record.get("sure")
    if not text or not sure or record.get("typethrough"):
        return None
    pieces = [s[0] for s in sure]
    raw, typed = "".join(pieces), record.get("typed") or ""
    for o in range(len(raw) + 1):  # past the typed text the model wrote again (token healing)
        if typed.endswith(raw[:o]) and raw[o:].startswith(text):
            return pieces, [s[1] for s in sure], [s[2] for s in sure], o
    return None


def blank(record: dict) -> bool:
    return not (record.get("typed") or "").strip()


def cut(record: dict, rule: ShowRule, weights=WEIGHTS) -> str:
    """The answer of `record` as `rule` shows it (place.py `Place.answer`'s cut)."""
    text, t = record.get("text") or "", tokens(record)
    if t is None:
        return text
    pieces, probs, leads, o = t
    n = shown_length(pieces, probs, leads, rule, o, blank(record), weights)
    if n is None or n >= len(text):
        return text
    shown = text[:n].rstrip()
    return shown if shown.strip() else ""


def score(recs: list[dict], rule: ShowRule, weights=WEIGHTS) -> tuple[int, int, int]:
    """(wrong, characters kept, first lines right) over `recs`."""
    wrong = kept = first = 0
    for r in recs:
        s = cut(r, rule, weights)
        q = keep_quality(s, r.get("true_rest") or "")
        wrong += q["wrong"]
        kept += q["kept_chars"]
        first += bool(s) and first_line_exact(r.get("typed") or "", s, r.get("true_line") or "")
    return wrong, kept, first


def samples(recs: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """One row per token of each answer up to where it leaves the truth: features, and whether it does there."""
    xs, ys = [], []
    for r in recs:
        t = tokens(r)
        if t is None:
            continue
        pieces, probs, leads, o = t
        text, rest = r["text"], r.get("true_rest") or ""
        k = 0  # characters of `text` that match what the user typed next
        while k < len(text) and k < len(rest) and text[k] == rest[k]:
            k += 1
        at, logp, first = 0, 0.0, True
        for piece, p, lead in zip(pieces, probs, leads):
            start, end = at - o, at + len(piece) - o
            at += len(piece)
            if end <= 0:
                continue
            if start >= len(text):
                break
            goes_wrong = k < len(text) and end > k
            xs.append(features(piece, p, lead, first, blank(r), logp))
            ys.append(float(goes_wrong))
            if goes_wrong:
                break
            logp += math.log(max(p, 1e-6))
            first = False
    return np.array(xs), np.array(ys)


def fit(x: np.ndarray, y: np.ndarray, l2: float = 1.0) -> tuple[float, ...]:
    """Logistic regression by Newton's method."""
    w = np.zeros(x.shape[1])
    for _ in range(50):
        p = 1.0 / (1.0 + np.exp(-(x @ w)))
        w -= np.linalg.solve((x.T * (p * (1 - p))) @ x + l2 * np.eye(len(w)), x.T @ (p - y) + l2 * w)
    return tuple(round(float(v), 3) for v in w)


def _row(name: str, got: tuple, base: tuple) -> str:
    ratio = [f"{g / b:.2f}" if b else "-" for g, b in zip(got, base)]
    return f"{name:<14} wrong {got[0]:<5} kept {got[1]:<6} first {got[2]:<4} (x all: {', '.join(ratio)})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ditto_bench.showtune", description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", help="results.json of editor replays, one per repository")
    ap.add_argument("--system", default="ditto", help="the replay system whose answers to cut (default ditto)")
    ap.add_argument("--fit", action="store_true", help="fit the weights, leaving one repository out at a time")
    args = ap.parse_args(argv)
    data = {path: records(path, args.system) for path in args.results}
    every = [r for recs in data.values() for r in recs]
    if not every:
        print(f"no records of system {args.system}", file=sys.stderr)
        return 2
    base = score(every, RULES["all"])
    print(f"{len(every)} requests in {len(data)} results; showing everything: wrong {base[0]}, "
          f"characters kept {base[1]}, first lines right {base[2]}")
    if not args.fit:
        for name, rule in RULES.items():
            print(_row(name, score(every, rule), base))
        for limit in LIMITS:
            print(_row(f"limit {limit}", score(every, ShowRule(limit)), base))
        return 0
    if len(data) < 2:
        print("--fit leaves one repository out at a time: give two results or more", file=sys.stderr)
        return 2
    held = {limit: np.zeros(3) for limit in LIMITS}
    for path, recs in data.items():
        weights = fit(*samples([r for p, rs in data.items() if p != path for r in rs]))
        for limit in LIMITS:
            held[limit] += score(recs, ShowRule(limit), weights)
    print("each repository judged by weights fitted on the others:")
    for limit in LIMITS:
        print(_row(f"limit {limit}", tuple(int(v) for v in held[limit]), base))
    x, y = samples(every)
    print(f"WEIGHTS fitted on all ({len(y)} tokens, {int(y.sum())} where an answer went wrong): {fit(x, y)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
