"""A suggestion, the generation it comes from (`Place`), and a place's life (`Places`).

A `Place` is one generation at one cursor position, answered in pieces: at a deadline, then from
its continuation, then by type-through. `Places` is what happens to it after its first answer:
a request whose text before the cursor is the old one plus a start of the suggestion is answered
from it (`from_place`: at once when the rest is there, else by resuming the paused generation),
idle work finishes a paused generation (`continue_place`), and the test hook compares the pieces
with one uninterrupted generation (`check_place`). The places themselves live in the files'
states (files.py `FileState.place`); the Completer looks them up and hands them in.

Left out on purpose: prompts (context.py, prompts.py), which drafter (drafting.py), and starting
a generation (the Completer's `complete`, lsp_server/completion/completer.py).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import Callable

from lsp_server.completion.context import Prompt, split_at
from lsp_server.completion.show import RULES, ShowRule, shown_length
from lsp_server.completion.stops import finish, ghost_cut
from lsp_server.decoding.types import Completion, DecodeOptions, RequestContext, Stats

_PARTIAL = "\ufffd"  # what decoding shows for the first bytes of a character not yet complete


@dataclass
class Suggestion:
    text: str  # the ghost text, after stop rules
    raw: str  # everything the model produced
    prompt: Prompt
    completion: Completion
    drafter: str
    latency_ms: float
    typethrough: bool = False  # served from the suggestion on screen, without the model
    notice: str | None = None  # one line for the user (a remote engine failed), set once per problem
    continuing: bool = False  # answered at the deadline: the rest is still to be generated (Completer.continue_place)
    from_continuation: bool = False  # its text was generated after an earlier answer's deadline
    resumed: bool = False  # served by resuming the generation paused at this place (no new prompt)
    ahead: bool = False  # generated while the worker was idle, before the request came (Completer.ahead)
    withheld: str = ""  # what the model wrote after `text` and the `show` rule held back (show.py)

    def summary(self, model: str) -> dict:
        s = self.completion.stats
        return {
            "typethrough": self.typethrough,
            "text": self.text,
            "tokens": s.tokens,
            "target_passes": s.target_passes,
            "drafted": s.drafted,
            "accepted": s.accepted,
            "acceptance_rate": round(s.acceptance_rate, 4),
            "tokens_per_pass": round(s.tokens_per_pass, 4),
            "prefill_tokens": s.prefill_tokens,
            "reused_tokens": s.reused_tokens,
            "prompt_tokens": len(self.prompt.ids),
            "prefill_ms": round(s.prefill_ms, 1),
            "decode_ms": round(s.decode_ms, 1),
            "latency_ms": round(self.latency_ms, 1),
            "stop_reason": s.stop_reason,
            "withheld": self.withheld,
            "model": model,
            "drafter": self.drafter,
        }



class Place:
    """One generation at one cursor position, and how its text becomes ghost text.

    The model's text is read from the cursor of the request that started it (`relative`:
    past the healed text) and cut by the ghost-text stop rules (`done`; `finish` once the
    generation has ended); the answer to a request whose cursor is `offset` characters
    further along is the suggestion from there, whole lines only (whole words while the
    first line is still being written) until the generation is finished, and only as far as the
    `show` rule says the model is sure of it from there (show.py; judged anew at every answer, so a
    user who typed through an unsure token has made it theirs).
    """

    def __init__(self, before: str, after: str, prompt: Prompt, heal: str, multiline: bool, drafter: str,
                 decode: Callable[[list[int]], str], show: ShowRule = RULES["all"]):
        self.before, self.after, self.prompt, self.heal, self.multiline = before, after, prompt, heal, multiline
        self.drafter, self.decode, self.show = drafter, decode, show
        self._pieces: tuple[int, list[str]] = (0, [])  # (tokens decoded, each token's text)
        self.raw = ""
        self.text = ""  # the suggestion so far, from the original cursor
        self.completion = Completion([], Stats(), [])
        self.finished = False
        self.first = 0  # characters of `text` the first answer covered: served beyond that = from the continuation
        self.pauses = 0  # times its generation paused at a deadline
        self.ahead = False  # generated while idle for a request not made yet, and not shown (Completer.ahead)
        # The same generation again, uninterrupted (no deadline, no time limit): Completer.check_place's reference.
        self.again: Callable[[], Completion] | None = None

    def relative(self, generated: str) -> str | None:
        """The generated text from the real cursor on; None while it is still inside the healed text,
        "" when the model wrote something else than the healed word (nothing to show)."""
        heal = self.heal
        if generated.startswith(heal):
            return generated[len(heal) :]
        written = generated.rstrip(_PARTIAL)  # a multi-byte character still being written
        if heal.startswith(written):
            return None
        if heal.strip(" \t"):
            return ""
        return generated.lstrip(" \t")  # the model chose other blanks: keep its code, not its blanks

    def done(self, generated: str) -> bool:
        """Whether the ghost-text stop rules have ended the suggestion in `generated`."""
        rel = self.relative(generated)
        if rel == "" and not generated.startswith(self.heal):
            return True  # it did not write the typed word (an unconstrained engine): stop
        return rel is not None and ghost_cut(rel, self.prompt, self.multiline) is not None

    def pause_rule(self, offset: int, first_answer_s: float | None) -> Callable[[list[int]], bool]:
        """A pause(out) rule for the engine: the suggestion from `offset` on has a complete
        non-blank first line, or decoding has run `first_answer_s` and it has some text. The time
        counts from the first pass of decoding (not from the request: prefill is not decoding)."""
        started: list[float] = []

        def pause(out: list[int]) -> bool:
            if not started:
                started.append(time.perf_counter())
            rel = self.relative(self.decode(out))
            if rel is None:
                return False
            rest = rel[offset:].rstrip(_PARTIAL)  # not inside a character still being written
            if _has_complete_line(rest):
                return True
            return first_answer_s is not None and time.perf_counter() - started[0] >= first_answer_s and \
                bool(rest.strip())

        return pause

    def update(self, raw: str, completion: Completion) -> None:
        self.raw, self.completion = raw, completion
        reason = completion.stats.stop_reason
        self.finished = reason not in ("paused", "cancelled")
        self.pauses += int(reason == "paused")
        rel = self.relative(raw) or ""
        if self.finished:
            text = finish(rel, self.prompt, self.multiline)
            if reason in ("time", "interrupted") and "\n" in text:
                text = text[: text.rfind("\n")]  # cut short: show the complete lines only
        else:
            cut = ghost_cut(rel, self.prompt, self.multiline)
            text = rel if cut is None else rel[:cut]
        self.text = text

    def sure_length(self, offset: int) -> int | None:
        """Characters of the suggestion from `offset` on that the `show` rule shows (None: all)."""
        c = self.completion
        if self.show.limit is None or not c.probs:
            return None
        rel = self.relative(self.raw)
        if rel is None:
            return None
        if self._pieces[0] != len(c.tokens):
            pieces, before = [], ""
            for i in range(len(c.tokens)):  # each token's text (a character split over tokens: in the last)
                text = self.decode(c.tokens[: i + 1])
                pieces.append(text[len(before):] if text.startswith(before) else text)
                before = text
            self._pieces = (len(c.tokens), pieces)
        line = (self.prompt.typed + self.text[:offset]).rsplit("\n", 1)[-1]
        return shown_length(self._pieces[1], c.probs, c.margins, self.show, len(self.raw) - len(rel) + offset,
                            not line.strip())

    def complete_after(self, offset: int) -> bool:
        """Whether the suggestion from `offset` on has a complete line to show (or is all there)."""
        return self.finished or _has_complete_line(self.text[offset:])

    def answer(self, offset: int, latency_ms: float, *, notice: str | None = None, typethrough: bool = False,
               resumed: bool = False) -> Suggestion:
        """The ghost text for a cursor `offset` characters past the original one. The first answer of a
        place generated ahead (idle work) is its first answer, whether it resumed the generation or not."""
        ahead, self.ahead = self.ahead and offset == 0, False
        if ahead:
            typethrough = False
        shown = self.text[offset:]
        withheld = ""
        sure = self.sure_length(offset)
        if sure is not None and sure < len(shown):  # the model is not sure of the rest (show.py)
            withheld = shown[sure:]
            shown = shown[:sure].rstrip()
            shown = shown if shown.strip() else ""
        if not self.finished and shown:
            shown = shown.rstrip(_PARTIAL)
            shown = shown[: shown.rfind("\n")] if _has_complete_line(shown) else _whole_words(shown)
            shown = shown.rstrip()
            after = self.after.split("\n", 1)[0].rstrip("\r")
            if not shown.strip() or (after and after.startswith(shown)):
                shown = ""
        if offset == 0 and not typethrough and (ahead or not resumed):
            self.first = len(shown)
        completion = self.completion if not typethrough else Completion([], Stats(stop_reason="typethrough"), [])
        if ahead and completion.stats.stop_reason == "cancelled":
            # Its finishing while idle was stopped by this very request: paused, not a cancelled request.
            completion = replace(completion, stats=replace(completion.stats, stop_reason="paused"))
        return Suggestion(shown, self.raw, self.prompt, completion, self.drafter, latency_ms, typethrough=typethrough,
                          notice=notice, continuing=not self.finished, resumed=resumed, ahead=ahead, withheld=withheld,
                          from_continuation=(typethrough or resumed) and not ahead and bool(shown)
                          and offset + len(shown) > self.first)


class Places:
    """A place's life after its first answer (module docstring), on the Completer's generation step
    (`generator`: `paused(key)`, `resume(key, ...)`); `decode` writes the model's tokens as text.
    Each call gets the place answered for `key` (None where there is none)."""

    def __init__(self, generator, decode: Callable[[list[int]], str]):
        self.generator = generator
        self.decode = decode
        self.continued = 0  # generations resumed after their deadline (idle work or a request)

    def pending(self, key: str, place: Place | None) -> bool:
        """Whether the generation answered for `key` paused at its deadline and can be finished."""
        return place is not None and not place.finished and self.generator.paused(key)

    @staticmethod
    def place_fits(place: Place | None, text: str, line: int, col: int) -> bool:
        """Whether the suggestion of `place` could serve a request at (line, col) of `text` (the text
        after the cursor unchanged, the text typed since is the suggestion's start)."""
        if place is None:
            return False
        before, after = around_cursor(text, line, col)
        return after == place.after and before.startswith(place.before) and \
            place.text.startswith(before[len(place.before):])

    def continue_place(self, key: str, place: Place | None, cancel: threading.Event | None = None,
                       ctx: RequestContext | None = None) -> bool:
        """Finish the paused generation of `key` (idle work); True when it ran. Cancelled, it stays
        paused: a later call or the next request there goes on from where it stopped."""
        if not self.pending(key, place):
            return False
        completion = self.generator.resume(key, cancel=cancel, ctx=ctx)
        if completion is None:
            return False
        place.update(self.decode(completion.tokens), completion)
        self.continued += 1
        return True

    def check_place(self, key: str, place: Place | None) -> dict | None:
        """Test hook (the server's `ditto/debug/checkPlace`; the editor replay's check that a deadline
        and its continuation give one uninterrupted generation): finish the generation answered for
        `key`, generate its prompt again without a deadline or time limit, and compare the tokens.
        None when no generation there paused at a deadline. A generation cut short before it wrote
        anything is no evidence either way: "identical" is None then, not True."""
        if place is None or place.again is None or not place.pauses:
            return None
        while self.pending(key, place):
            completion = self.generator.resume(key)
            if completion is None:
                break
            place.update(self.decode(completion.tokens), completion)
        pieces = place.completion
        whole = place.again()
        got, want = list(pieces.tokens), list(whole.tokens)
        cut = pieces.stats.stop_reason in ("time", "cancelled", "interrupted")  # ended early: a prefix is enough
        same = got == want or (cut and want[: len(got)] == got)
        if cut and not got and want:
            same = None  # cut short with nothing written: the check compared nothing
        place.again = None  # checked once
        return {"identical": same, "tokens": len(got), "uninterrupted_tokens": len(want), "pauses": place.pauses,
                "stop_reason": pieces.stats.stop_reason}

    def from_place(self, text: str, line: int, col: int, key: str, place: Place | None, opts: DecodeOptions,
                   cancel: threading.Event | None, ctx: RequestContext | None) -> Suggestion | None:
        """The rest of the suggestion of `place` when the user typed its beginning, else None.

        Served only when the text after the cursor is unchanged and the text before it is
        the old text plus the typed characters, so a suggestion is never served for other
        surrounding text. A sampled suggestion is not re-served (a new request must draw).
        When the rest is not generated yet the paused generation resumes to the next
        complete line (the deadline applies again)."""
        if place is None or not opts.greedy:
            return None
        before, after = around_cursor(text, line, col)
        if after != place.after or len(before) < len(place.before) or not before.startswith(place.before):
            return None
        if len(before) == len(place.before) and not place.ahead:
            return None  # asked again where it was shown: a new generation (the user may have dismissed it)
        typed = before[len(place.before) :]
        if not place.text.startswith(typed):
            return None
        if len(typed) >= len(place.text) or not place.complete_after(len(typed)):
            if not self.pending(key, place):
                return None if len(typed) >= len(place.text) else place.answer(len(typed), 0.0, typethrough=True)
            completion = self.generator.resume(key, cancel=cancel, pause=place.pause_rule(len(typed), opts.first_answer_s),
                                               ctx=ctx)
            if completion is None:
                return None
            place.update(self.decode(completion.tokens), completion)
            self.continued += 1
            if not place.text.startswith(typed) or len(typed) >= len(place.text):
                return None
            return place.answer(len(typed), 0.0, resumed=True)
        return place.answer(len(typed), 0.0, typethrough=True)


def around_cursor(text: str, line: int, col: int) -> tuple[str, str]:
    """The document split at 0-based (line, col): (text before the cursor, text after it)."""
    above, typed, after, below = split_at(text, line, col)
    return above + typed, after + below


def _has_complete_line(text: str) -> bool:
    """A newline follows some non-blank text: the first line of `text` is complete."""
    i = text.find("\n")
    while i >= 0:
        if text[:i].strip():
            return True
        i = text.find("\n", i + 1)
    return False


def _whole_words(text: str) -> str:
    """`text` without a word still being written at its end (a paused first line shows whole words)."""
    i = len(text)
    while i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_"):
        i -= 1
    return text[:i] if text[:i].strip() else text
