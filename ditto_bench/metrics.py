"""Aggregate per-task records into per-system summaries (pure Python: no torch, no model).

A record is one system on one task, a dict as written to results.json "tasks" (see
docs/benchmark.md): at least "task", "system", "copyable", "latency_ms", "decode_ms",
"generated", "target_passes", "drafted", "accepted", "drafted_at", "accepted_at",
"identical", "exact_match", "first_line_exact", "edit_similarity",
"first_line_edit_similarity", and in keystroke mode "tts_ms", "prefill_tokens",
"typethrough"; session mode adds "session", "event", "window_moved", "idle_prefill_tokens".
The editor replay's records (replay.py; one per request, with "kind" cold/warm) are
summarised by `summarise_replay`. What one suggestion is worth (its record's quality fields) is
defined in quality.py; here it is only counted.
"""

from __future__ import annotations

import math
import statistics
from typing import Iterable

from lsp_server.numbers import percentile  # noqa: F401  (one definition; reports and tests use it from here)

BUCKETS = ((0.0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 1.0001))


def bucket_name(lo: float, hi: float) -> str:
    return f"{lo:.2f}-{min(hi, 1.0):.2f}"


def geomean(values: Iterable[float]) -> float | None:
    xs = [v for v in values if v is not None and v > 0]
    if not xs:
        return None
    return math.exp(sum(math.log(v) for v in xs) / len(xs))


def _mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def _r(x, nd=4):
    return None if x is None else round(x, nd)


def speedups(records: list[dict], reference: str = "off", key: str = "latency_ms") -> dict[tuple[str, str], float]:
    """(task, system) -> reference time / system time on the same task."""
    ref = {r["task"]: r[key] for r in records if r["system"] == reference and r.get(key)}
    out = {}
    for r in records:
        if r["task"] in ref and r.get(key):
            out[(r["task"], r["system"])] = ref[r["task"]] / r[key]
    return out


def summarise_completion(records: list[dict], reference: str = "off") -> dict:
    """Per-system summary of completion-mode records (only tasks every system finished count)."""
    systems = list(dict.fromkeys(r["system"] for r in records))
    done = _complete_tasks(records, systems)
    records = [r for r in records if r["task"] in done]
    sp = speedups(records, reference, "latency_ms")
    dsp = speedups(records, reference, "decode_ms")
    summary = {}
    for s in systems:
        rs = [r for r in records if r["system"] == s]
        if not rs:
            continue
        lat = [r["latency_ms"] for r in rs]
        tokens = sum(r["generated"] for r in rs)
        decode_s = sum(r["decode_ms"] for r in rs) / 1000
        passes = sum(r["target_passes"] for r in rs)
        drafted = [r["drafted"] for r in rs if r.get("drafted") is not None]
        accepted = [r["accepted"] for r in rs if r.get("accepted") is not None]
        ratios = [sp[(r["task"], s)] for r in rs if (r["task"], s) in sp]
        dratios = [dsp[(r["task"], s)] for r in rs if (r["task"], s) in dsp]
        summary[s] = {
            "tasks": len(rs),
            "latency_ms_p50": _r(percentile(lat, 50), 1),
            "latency_ms_p95": _r(percentile(lat, 95), 1),
            "prefill_ms_mean": _r(_mean([r["prefill_ms"] for r in rs]), 1),
            "decode_ms_p50": _r(percentile([r["decode_ms"] for r in rs], 50), 1),
            "tokens_per_s": _r(tokens / decode_s if decode_s > 0 else None, 3),
            "passes_per_token": _r(passes / tokens if tokens else None),
            "acceptance_rate": _r(sum(accepted) / sum(drafted)) if drafted and sum(drafted) else None,
            "identical_rate": _r(_mean([float(r["identical"]) for r in rs if r.get("identical") is not None])),
            "exact_match": _r(_mean([float(r["exact_match"]) for r in rs])),
            "first_line_exact": _r(_mean([float(r["first_line_exact"]) for r in rs])),
            "edit_similarity": _r(_mean([r["edit_similarity"] for r in rs])),
            "first_line_edit_similarity": _r(_mean([r["first_line_edit_similarity"] for r in rs])),
            "empty_share": _r(_mean([float(bool(r.get("empty"))) for r in rs])),
            **keep_summary(rs),
            "speedup_median": _r(statistics.median(ratios) if ratios else None),
            "speedup_geomean": _r(geomean(ratios)),
            "decode_speedup_median": _r(statistics.median(dratios) if dratios else None),
            "decode_speedup_geomean": _r(geomean(dratios)),
            "acceptance_by_position": _by_position(rs),
            "steps": _steps(rs),
            "tasks_with_model_draft": sum(1 for r in rs if (r.get("steps") or {}).get("model")),
            **drafting(rs),
            "buckets": _buckets(rs, sp, dsp, s, "copyable"),
            "buckets_buffers": _buckets(rs, sp, dsp, s, "copyable_buffers"),
        }
    return summary


def drafting(rs: list[dict]) -> dict:
    """What the drafts bought, over the records' target passes (Ditto systems): tokens per pass
    (generated / passes; greedy verification is exact, so this is a property of the drafts and the
    model, the same on any device), passes with no draft, passes that verified a tree, rows per
    pass (1 + the draft tokens it verified), and the drafter's time per pass (n-gram systems)."""
    rounds = [x for r in rs for x in (r.get("rounds") or [])]
    passes = sum(r.get("target_passes") or 0 for r in rs)
    tokens = sum(r.get("generated") or 0 for r in rs if r.get("rounds") is not None)
    drafted = [r["draft_ms"] for r in rs if r.get("draft_ms") is not None]
    return {
        "passes": passes,
        "tokens_per_pass": _r(tokens / passes) if passes and rounds else None,
        "no_draft_passes": sum(1 for x in rounds if not x[2]) if rounds else None,
        "tree_passes": sum(1 for x in rounds if len(x) > 5 and x[5]) if rounds else None,
        "rows_per_pass": _r(_mean([1 + (x[5] if len(x) > 5 and x[5] else x[2]) for x in rounds]), 3) if rounds else None,
        "draft_ms_per_pass": _r(sum(drafted) / passes, 3) if drafted and passes else None,
    }


def _steps(rs: list[dict]) -> dict | None:
    """Target passes summed by draft source (records without "steps" — transformers systems — give None)."""
    have = [r["steps"] for r in rs if r.get("steps")]
    if not have:
        return None
    out: dict[str, int] = {}
    for st in have:
        for k, v in st.items():
            out[k] = out.get(k, 0) + v
    return out


def _complete_tasks(records: list[dict], systems: list[str]) -> set[str]:
    have: dict[str, set[str]] = {}
    for r in records:
        if r.get("error") is None:
            have.setdefault(r["task"], set()).add(r["system"])
    return {t for t, ss in have.items() if ss >= set(systems)}


def _by_position(rs: list[dict]) -> list[dict]:
    drafted: list[int] = []
    accepted: list[int] = []
    for r in rs:
        for i, (d, a) in enumerate(zip(r.get("drafted_at") or [], r.get("accepted_at") or [])):
            if i >= len(drafted):
                drafted.append(0)
                accepted.append(0)
            drafted[i] += d
            accepted[i] += a
    return [{"position": i + 1, "drafted": d, "accepted": a, "rate": _r(a / d if d else None)}
            for i, (d, a) in enumerate(zip(drafted, accepted))]


def _buckets(rs, sp, dsp, system, field) -> dict:
    out = {}
    for lo, hi in BUCKETS:
        inb = [r for r in rs if lo <= (r.get(field) or 0.0) < hi]
        ratios = [sp[(r["task"], system)] for r in inb if (r["task"], system) in sp]
        dratios = [dsp[(r["task"], system)] for r in inb if (r["task"], system) in dsp]
        drafted = sum(r.get("drafted") or 0 for r in inb)
        accepted = sum(r.get("accepted") or 0 for r in inb)
        out[bucket_name(lo, hi)] = {
            "tasks": len(inb),
            "speedup_geomean": _r(geomean(ratios)),
            "decode_speedup_geomean": _r(geomean(dratios)),
            "acceptance_rate": _r(accepted / drafted) if drafted else None,
        }
    return out


def summarise_keystroke(records: list[dict]) -> dict:
    """Per-system summary of keystroke-mode records (one record per request)."""
    summary = {}
    for s in dict.fromkeys(r["system"] for r in records):
        rs = [r for r in records if r["system"] == s and r.get("error") is None]
        if not rs:
            continue
        tts = [r["tts_ms"] for r in rs]
        summary[s] = {
            "requests": len(rs),
            "tasks": len({r["task"] for r in rs}),
            "tts_ms_p50": _r(percentile(tts, 50), 1),
            "tts_ms_p95": _r(percentile(tts, 95), 1),
            # the same over requests the model answered (type-through hits left out)
            "tts_ms_p50_model": _r(percentile([r["tts_ms"] for r in rs if not r.get("typethrough")], 50), 1),
            "prefill_tokens_mean": _r(_mean([r["prefill_tokens"] for r in rs]), 1),
            "reused_tokens_mean": _r(_mean([r["reused_tokens"] for r in rs]), 1),
            "prompt_tokens_mean": _r(_mean([r["prompt_tokens"] for r in rs]), 1),
            "prefill_ms_p50": _r(percentile([r["prefill_ms"] for r in rs], 50), 1),
            "decode_ms_p50": _r(percentile([r["decode_ms"] for r in rs], 50), 1),
            "typethrough_hits": sum(1 for r in rs if r.get("typethrough")),
            "acceptance_rate": _r(sum(r["accepted"] or 0 for r in rs) / d) if (d := sum(r["drafted"] or 0 for r in rs)) else None,
            "quality": quality_summary(rs),
        }
    base = {s: v for s, v in summary.items() if not s.endswith("-noreuse")}
    for s, v in base.items():
        nr = summary.get(f"{s}-noreuse")
        if not nr:
            continue
        # A p50 of type-through answers is ~0 ms: no ratio then (the model-answered one still says something).
        if v["tts_ms_p50"] and v["tts_ms_p50"] >= 1.0:
            v["tts_p50_gain_vs_noreuse"] = _r(nr["tts_ms_p50"] / v["tts_ms_p50"], 3)
        if v.get("tts_ms_p50_model") and nr.get("tts_ms_p50_model"):
            v["tts_p50_model_gain_vs_noreuse"] = _r(nr["tts_ms_p50_model"] / v["tts_ms_p50_model"], 3)
        if v["prefill_tokens_mean"] is not None and nr["prefill_tokens_mean"] is not None:
            v["prefill_tokens_gain_vs_noreuse"] = _r(nr["prefill_tokens_mean"] / max(v["prefill_tokens_mean"], 1e-9), 3)
    return summary


def summarise_session(records: list[dict]) -> dict:
    """Per-system summary of session-mode records (one record per request; runner.Bench.session).

    "model" figures leave out type-through answers (served from the suggestion on screen);
    the reused share of a request is reused_tokens / prompt_tokens.
    """
    summary = {}
    for s in dict.fromkeys(r["system"] for r in records):
        rs = [r for r in records if r["system"] == s and r.get("error") is None]
        if not rs:
            continue
        model = [r for r in rs if not r.get("typethrough")]
        tts_model = [r["tts_ms"] for r in model]
        prefill = [r["prefill_tokens"] for r in model]

        def share(kind: str) -> list[float]:
            return [r["reused_tokens"] / r["prompt_tokens"] for r in model if r.get("event") == kind and r["prompt_tokens"]]

        enter, move, typing = share("enter"), share("move"), share("type")
        summary[s] = {
            "requests": len(rs),
            "sessions": len({r["session"] for r in rs}),
            "tasks": len({r["task"] for r in rs}),
            "model_requests": len(model),
            "tts_ms_p50": _r(percentile([r["tts_ms"] for r in rs], 50), 1),
            "tts_ms_p95": _r(percentile([r["tts_ms"] for r in rs], 95), 1),
            "tts_ms_p50_model": _r(percentile(tts_model, 50), 1),
            "tts_ms_p95_model": _r(percentile(tts_model, 95), 1),
            "prefill_tokens_p50_model": _r(percentile(prefill, 50), 1),
            "prefill_tokens_p95_model": _r(percentile(prefill, 95), 1),
            "prefill_tokens_mean_model": _r(_mean(prefill), 1),
            "prompt_tokens_mean_model": _r(_mean([r["prompt_tokens"] for r in model]), 1),
            "enter_requests": len(enter),
            "reused_share_enter_mean": _r(_mean(enter)),
            "reused_share_enter_p50": _r(percentile(enter, 50)),
            "move_requests": len(move),
            "reused_share_move_mean": _r(_mean(move)),
            "reused_share_move_p50": _r(percentile(move, 50)),
            "reused_share_type_mean": _r(_mean(typing)),
            "window_moves": sum(1 for r in model if r.get("window_moved")),
            "typethrough_hits": len(rs) - len(model),
            "idle_prefill_hits": sum(1 for r in rs if (r.get("idle_prefill_tokens") or 0) > 0),
            "acceptance_rate": _r(sum(r["accepted"] or 0 for r in rs) / d) if (d := sum(r["drafted"] or 0 for r in rs)) else None,
            "quality": quality_summary(rs),
            **drafting(model),
        }
    _same_output_rates(records, summary)
    _same_suggestion_rates(records, summary)
    for s, v in summary.items():
        nr = summary.get(f"{s}-noreuse")
        if s.endswith("-noreuse") or not nr:
            continue
        for field, mine, theirs in (("prefill_tokens_p95_gain_vs_noreuse", v["prefill_tokens_p95_model"], nr["prefill_tokens_p95_model"]),
                                    ("tts_p95_model_gain_vs_noreuse", v["tts_ms_p95_model"], nr["tts_ms_p95_model"]),
                                    ("tts_p50_model_gain_vs_noreuse", v["tts_ms_p50_model"], nr["tts_ms_p50_model"])):
            if mine is not None and theirs is not None:
                v[field] = _r(theirs / max(mine, 1.0), 3)  # at least 1 token / 1 ms below: no division by ~0
    return summary


def _same_output_rates(records: list[dict], summary: dict) -> None:
    """Session mode's exactness check: every system replays the same requests in the same order,
    so its n-th request of a session is the reference's n-th. A system's requests that the model
    answered in both are compared token for token with `off` ("identical_to_off_rate", for the
    drafting systems) and with its reusing twin ("identical_to_reuse_rate", for `-noreuse`: reuse
    must never change a result). Type-through answers are left out: they come from the shown
    suggestion, and the -noreuse systems have none."""
    by: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        by.setdefault((r["system"], r["session"]), []).append(r)

    def rate(system: str, reference: str) -> tuple[float | None, int]:
        same = n = 0
        for (s, session), rs in by.items():
            if s != system:
                continue
            for mine, ref in zip(rs, by.get((reference, session), [])):
                if mine.get("error") or ref.get("error") or mine.get("typethrough") or ref.get("typethrough"):
                    continue
                n += 1
                same += mine.get("tokens") == ref.get("tokens")
        return (_r(same / n) if n else None), n

    for s, v in summary.items():
        base = s.removesuffix("-noreuse")
        if base != "off" and "off" in summary and not s.endswith("-noreuse"):
            v["identical_to_off_rate"], v["identical_to_off_compared"] = rate(s, "off")
        if s.endswith("-noreuse") and base in summary:
            v["identical_to_reuse_rate"], v["identical_to_reuse_compared"] = rate(s, base)


def _same_suggestion_rates(records: list[dict], summary: dict) -> None:
    """Session mode's exactness by completion mode's rule (runner.same_output): the same text, and
    one token list a prefix of the other. `identical_to_off_rate` compares token lists exactly, and a
    system that gains several tokens per pass may generate a few tokens past the point where the
    stop rules cut `off`'s suggestion (they never reach the user); this one leaves those out."""
    by: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        by.setdefault((r["system"], r["session"]), []).append(r)
    for s, v in summary.items():
        if s == "off" or s.endswith("-noreuse") or "off" not in summary:
            continue
        same = n = 0
        for (system, session), rs in by.items():
            if system != s:
                continue
            for mine, ref in zip(rs, by.get(("off", session), [])):
                if mine.get("error") or ref.get("error") or mine.get("typethrough") or ref.get("typethrough") \
                        or "text" not in mine or "text" not in ref:
                    continue
                a, b = mine.get("tokens") or [], ref.get("tokens") or []
                k = min(len(a), len(b))
                n += 1
                same += mine["text"] == ref["text"] and a[:k] == b[:k]
        if n:
            v["same_suggestion_as_off_rate"], v["same_suggestion_as_off_compared"] = _r(same / n), n


def mismatches(records: list[dict]) -> list[dict]:
    return [{"task": r["task"], "system": r["system"], "text": r.get("text"), "reference": r.get("reference_text")}
            for r in records if r.get("identical") is False]


REPLAY_KINDS = ("cold", "warm", "all")


def quality_summary(rs: list[dict]) -> dict:
    """Issue 25's quality figures over requests whose records carry quality.request_quality's
    fields: typed + first line = truth (count and rate), the suggestion's edit similarity to the
    rest of the block, the share of empty suggestions, and whole-word misfires among the
    requests where one can happen."""
    exact = sum(1 for r in rs if r.get("first_line_exact"))
    eligible = [r for r in rs if r.get("misfire") is not None]
    misfires = sum(1 for r in eligible if r["misfire"])
    return {
        "first_line_exact": exact,
        "first_line_exact_rate": _r(exact / len(rs)) if rs else None,
        "edit_similarity_mean": _r(_mean([r.get("edit_similarity") for r in rs])),
        "empty_share": _r(sum(1 for r in rs if r.get("empty")) / len(rs)) if rs else None,
        "misfires": misfires,
        "misfire_eligible": len(eligible),
        "misfire_share": _r(misfires / len(eligible)) if eligible else None,
        **keep_summary(rs),
    }


def keep_summary(rs: list[dict]) -> dict:
    """What the user keeps, over requests `rs` whose records carry quality.keep_quality's fields:
    shown, kept and wrong (counts), wrong a request (wrong / requests: the headline) and characters
    kept a request (averaged over every request, one with nothing shown counting 0). None where no
    record carries them (a results.json written before they existed)."""
    have = [r for r in rs if "shown" in r]
    wrong = sum(1 for r in have if r["wrong"])
    return {
        "shown": sum(1 for r in have if r["shown"]) if have else None,
        "kept": sum(1 for r in have if r["kept"]) if have else None,
        "wrong": wrong if have else None,
        "wrong_per_request": _r(wrong / len(have)) if have else None,
        "kept_chars_per_request": _r(sum(r["kept_chars"] for r in have) / len(have), 3) if have else None,
    }


def _replay_group(rs: list[dict], timeout_ms: float) -> dict:
    """One row of the replay summary: time to suggestion, quality, prompt work, over requests `rs`.

    A timed-out request counts in the percentiles at the timeout (a lower bound of its time)."""
    tts = [r["tts_ms"] if r.get("tts_ms") is not None else timeout_ms for r in rs]
    # --check-continuations. A generation cut short before it wrote a token compared nothing
    # (`identical` None, completer.py `check_place`): counted apart, neither identical nor not.
    ran = [r["continuation"] for r in rs if r.get("continuation")]
    checked = [c for c in ran if c.get("identical") is not None]
    return {
        "n": len(rs),
        "continuations_checked": len(checked),
        "continuations_identical": sum(1 for c in checked if c.get("identical")),
        "continuations_empty": len(ran) - len(checked),
        "timeouts": sum(1 for r in rs if r.get("timeout")),
        # answers the replay accepted (sent as one insert before the rest was typed: replay_script.accepted)
        "acceptances": sum(1 for r in rs if r.get("acceptance_sent")),
        "tts_ms_p50": _r(percentile(tts, 50), 1),
        "tts_ms_p95": _r(percentile(tts, 95), 1),
        **quality_summary(rs),
        "prompt_tokens_p50": _r(percentile([r["prompt_tokens_processed"] for r in rs
                                            if r.get("prompt_tokens_processed") is not None], 50), 1),
        # The context the model saw (Ditto's prompt, the peer's tokens_evaluated) beside what it processed.
        "prompt_tokens_seen_p50": _r(percentile([r["prompt_tokens"] for r in rs
                                                 if r.get("prompt_tokens") is not None], 50), 1),
        # Ditto's requests answered with the whole file above the place (issue 40), of those it reports for.
        "whole_file": sum(1 for r in rs if r.get("whole_file")),
        "whole_file_known": sum(1 for r in rs if r.get("whole_file") is not None),
        "typethrough": sum(1 for r in rs if r.get("typethrough")),
        "idle_ms_p50": _r(percentile([r["idle_ms"] for r in rs if r.get("idle_ms") is not None], 50), 1),
    }


def summarise_replay(records: list[dict], peer: str = "llama-server", timeout_ms: float = 120_000.0) -> dict:
    """Per-system summary of editor-replay records (replay.py): cold, warm and all requests apart.

    Each Ditto system also gets `vs_peer`: the peer's p50 / p95 over its own, cold and warm
    (above 1: Ditto is faster), from the same run.
    """
    summary = {}
    for s in dict.fromkeys(r["system"] for r in records):
        rs = [r for r in records if r["system"] == s]
        drafted = [r["drafted"] for r in rs if r.get("drafted") is not None]
        summary[s] = {
            "requests": len(rs),
            "sessions": len({r["session"] for r in rs}),
            "tasks": len({r["task"] for r in rs}),
            # Draft tokens the engine verified, summed (Ditto's trace; None for the peer): 0 where
            # no draft could pay on the pass costs (lsp_server/decoding/speculation.py `can_pay`).
            "drafted": sum(drafted) if drafted else None,
            **{kind: _replay_group([r for r in rs if kind == "all" or r["kind"] == kind], timeout_ms)
               for kind in REPLAY_KINDS},
        }
    theirs = summary.get(peer)
    for s, v in summary.items():
        if s == peer or theirs is None:
            continue
        ratios = {}
        for kind in ("cold", "warm"):
            for p in ("p50", "p95"):
                mine, other = v[kind][f"tts_ms_{p}"], theirs[kind][f"tts_ms_{p}"]
                ratios[f"{kind}_{p}"] = _r(other / max(mine, 1.0), 3) if mine is not None and other is not None else None
        v["vs_peer"] = ratios
    return summary
