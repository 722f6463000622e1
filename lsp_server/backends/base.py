"""What the engine and the prompt builder need from a model: the backend interface.

A loaded model is one object with two sides (docs/design.md, "Backends"):

- the tensor side, `Backend`: `forward(ids, cache, last)` runs the model over new tokens
  after what `cache` holds and returns float32 logits for the *last* `last` rows
  ([last, vocab]; `last = len(ids)` for every row); `new_cache()`; `crop(cache, keep)`
  keeps the first `keep` tokens of a cache; `release(cache)` frees what a cache holds
  outside Python (a llama.cpp sequence); `stop_ids`; `vocab_size` (rows of the logits);
- the text side, `Tokenizer`: `encode`, `decode`, `token_text`, `fim` (FIM token ids or
  None), `vocabulary()` (token -> id, for the same-tokenizer check of a draft model) and
  `special_ids()`.

`describe()` says where it runs ({"backend", "device", "dtype"}) for `ditto/stats`, the
`models` command and benchmark reports. Implementations: lsp_server/backends/torch/
(torch + transformers, the reference and the GPU path) and lsp_server/backends/llama/
(llama.cpp). Nothing outside a backend module reaches into the library objects it wraps.

The two kinds of loaded model are types, so nothing branches on probing attributes:

- a `TensorBackend` (torch, llama.cpp) runs forward passes for Ditto's own engine, and
  declares its optional features with their defaults here: `block` (prompt passes on
  whole blocks, `WholeBlocks`), `reusable` (how much of a cached prefix a prompt may keep),
  `fixed_rows` (one fixed pass shape), `tie_margin` (the near-tie guard), `serial_rows`
  (a multi-row pass runs its rows one by one, so no draft can pay) and `trees` (tree passes);
- a `GeneratingModel` (a remote engine, lsp_server/backends/remote/) has the text side
  only and brings its own generation step (`generator()`, a `Generator`).

Also here, shared by every backend: `ModelError` (one line saying what to do), FIM token
discovery from a vocabulary, and the names of stop tokens.
Left out on purpose: loading (lsp_server/backends/loader.py picks a backend for a spec), decoding.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence, runtime_checkable

from lsp_server.decoding.types import DecodeOptions, Generated

Progress = Callable[[str, "float | None"], None]  # (message, fraction done or None)


class ModelError(Exception):
    """A model could not be loaded; str(err) is one line saying what to do."""


@dataclass(frozen=True)
class FimTokens:
    prefix: int
    suffix: int
    middle: int
    file_sep: int | None = None


@runtime_checkable
class Tokenizer(Protocol):
    """The text side of a model."""

    fim: FimTokens | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_text(self, tid: int) -> str: ...

    def vocabulary(self) -> dict[str, int]: ...

    def token_bytes(self) -> list[bytes]:
        """The bytes each id writes, b"" for special tokens (token healing, lsp_server/decoding/healing.py)."""
        ...

    def special_ids(self) -> dict[str, int | None]: ...


@runtime_checkable
class Backend(Protocol):
    """The tensor side of a model: what the engine's decode loop calls."""

    spec: str  # the spec it was loaded from
    name: str  # a readable name
    stop_ids: frozenset[int]
    vocab_size: int
    load_seconds: float

    def new_cache(self) -> object: ...

    def forward(self, ids: Sequence[int], cache: object, last: int): ...  # -> float32 logits [last, vocab_size]

    def crop(self, cache: object, keep: int) -> None: ...

    def release(self, cache: object) -> None: ...

    def describe(self) -> dict: ...

    # Optional: reusable(cache, keep, length) -> int, how much of a cached prefix of `keep` tokens a
    # new prompt of `length` tokens may keep (default: all of it); see WholeBlocks.


class WholeBlocks:
    """Prompt passes cut at fixed places, so that KV reuse computes what a fresh prefill computes
    (docs/backends.md, "Reuse computes what a fresh prefill computes").

    Neither llama.cpp nor torch on a CPU is batch-invariant: a row's KV and logits depend on
    how many rows share its pass. A backend mixing this in cuts every prompt pass at the
    plan's cuts (`pieces`) and reports each pass (`passed`) and crop (`cropped`). The cuts are
    the multiples of `block` and, after a sequence's first <fim_middle>, the end of that token
    and of every token that ends a line: the lines typed at a place, which the prompt keeps in
    its middle (lsp_server/completion/context.py `_middle_from`, each line tokenized on its own).
    Whether a position is a cut depends only on the tokens up to it, so two prompts that share
    a prefix have the same cuts within it. A cache records how far it was computed in passes
    of that plan (`aligned`, with the line cuts among them in `cuts`) and where a shorter pass
    that began there ended (`tail`); `reusable` tells the engine how much of a cached prefix a
    new prompt may keep: up to its last cut, or all of it when it is that very prompt. The rest
    is recomputed in the passes a fresh prefill runs, so by induction over passes every cell
    holds a fresh prefill's bits. The line cuts make a line typed at a place cost that line
    (and the next line's start), not also the rest of a 32-token block before it.
    """

    block = 32  # 0: passes are not cut and a cached prefix is kept whole (torch's default)

    def _middle_id(self) -> int | None:
        fim = getattr(self, "fim", None)
        return fim.middle if fim is not None else None

    def _ends_line(self, tid: int) -> bool:
        """Whether token `tid` writes a newline (its text read once per id)."""
        memo = self.__dict__.setdefault("_line_ends", {})
        got = memo.get(tid)
        if got is None:
            try:
                got = memo[tid] = "\n" in self.token_text(tid)
            except Exception:  # an id the tokenizer cannot write: no cut
                got = memo[tid] = False
        return got

    def _cuts(self, cache, pos: int, ids: Sequence[int]) -> tuple[list[bool], int]:
        """For each of `ids` (at pos, pos + 1, ... of `cache`): whether the plan cuts after it; and
        the position after the sequence's first <fim_middle> (0: none yet)."""
        middle = self._middle_id()
        mid = getattr(cache, "mid", 0)
        out = []
        for i, tid in enumerate(ids):
            end = pos + i + 1
            cut = end % self.block == 0
            if middle is not None:
                if not mid and tid == middle:
                    mid, cut = end, True
                elif mid and self._ends_line(tid):
                    cut = True
            out.append(cut)
        return out, mid

    def pieces(self, cache, pos: int, ids: Sequence[int]) -> list[int]:
        """Sizes of the passes for `ids` from position pos of `cache`: cut where the plan cuts."""
        n = len(ids)
        if not self.block:
            return [n] if n else []
        cuts, _ = self._cuts(cache, pos, ids)
        out, start = [], 0
        for i, cut in enumerate(cuts):
            if cut or i == n - 1:
                out.append(i + 1 - start)
                start = i + 1
        return out

    def passed(self, cache, pos: int, ids: Sequence[int]) -> None:
        """A pass wrote `ids` at positions pos..pos+len(ids)-1 of `cache`."""
        if not self.block or not ids:
            return
        cuts, cache.mid = self._cuts(cache, pos, ids)
        if getattr(cache, "aligned", 0) != pos or any(cuts[:-1]):
            return  # not a pass of the plan: it began after a cut left out, or a cut falls inside it
        end = pos + len(ids)
        if cuts[-1]:
            cache.aligned, cache.tail = end, 0
            if end % self.block:
                cache.cuts = [*getattr(cache, "cuts", ()), end]
        else:
            cache.tail = end

    def cropped(self, cache, keep: int) -> None:
        """`cache` now holds its first `keep` tokens."""
        if not self.block:
            return
        a = min(getattr(cache, "aligned", 0), keep)
        cuts = [c for c in getattr(cache, "cuts", ()) if c <= a]
        cache.cuts = cuts
        cache.aligned = max(a - a % self.block, cuts[-1] if cuts else 0)
        if getattr(cache, "tail", 0) > keep:
            cache.tail = 0
        if getattr(cache, "mid", 0) > keep:
            cache.mid = 0

    def reusable(self, cache, keep: int, length: int | None = None) -> int:
        """How much of a cached prefix of `keep` tokens a prompt of `length` tokens may keep."""
        keep = max(0, int(keep))
        if not self.block:
            return keep
        if keep == length and keep == getattr(cache, "tail", 0):
            return keep
        keep = min(keep, getattr(cache, "aligned", 0))
        cut = max((c for c in getattr(cache, "cuts", ()) if c <= keep), default=0)
        return max(keep - keep % self.block, cut)

    @staticmethod
    def reset_plan(cache) -> None:
        """`cache` holds nothing computed in the plan's passes."""
        cache.aligned = cache.tail = cache.mid = 0
        cache.cuts = []

    @staticmethod
    def copy_plan(src, dst) -> None:
        """`dst` holds a copy of `src`'s cells (cropped after)."""
        dst.aligned, dst.tail, dst.mid = getattr(src, "aligned", 0), getattr(src, "tail", 0), getattr(src, "mid", 0)
        dst.cuts = list(getattr(src, "cuts", ()))


class TensorBackend(WholeBlocks):
    """Base class of the backends that run forward passes (torch, llama.cpp): the optional
    features the engine reads, declared with their defaults (module docstring)."""

    fixed_rows: int | None = None  # every pass over at most this many rows runs at this one shape (docs/gpu.md)
    tie_margin: float | None = None  # a verify pass deciding a token by less than this is undone (docs/backends.md)
    serial_rows: bool = False  # a pass over n rows is n one-row passes: T(n) = n T(1) by construction
    # Tree passes (docs/drafters.md, "Trees"): `tree_next(cache, parents)` makes the next forward over
    # `cache` one whose row j > 0 continues row parents[j] and sees only its ancestors; then
    # `keep_rows(cache, start, rows)` keeps the accepted path's rows. False: drafts stay chains.
    trees: bool = False
    kv_bytes_per_token: int = 0  # KV memory a cached token takes (0: unknown); bounds files' prefix KVs
    # Whether its probabilities say how sure it is (a trained model). The random test model's are noise, so
    # its suggestions are shown whole whatever the `show` setting (lsp_server/completion/show.py).
    calibrated: bool = True
    max_sequence: int | None = None  # tokens one cache can hold (a llama.cpp slot), None: the model's limit

    def clone(self, cache, keep: int):
        """A new cache holding the first `keep` tokens of `cache` (lsp_server/decoding/prefix.py `seed`)."""
        raise NotImplementedError(f"{type(self).__name__} cannot copy a cache")


class Model(Backend, Tokenizer, Protocol):
    """A loaded model: both sides in one object."""


class Generator:
    """The generation step of a completion (lsp_server/completion/completer.py), and what it can do.

    It gets the prompt (token ids) and a `done(text)` rule and returns the generated text.
    `EngineGenerator` (lsp_server/completion/local.py) runs Ditto's own engine; a remote engine's
    `RemoteGenerator` streams over HTTP and closes the stream once `done` says the
    suggestion has ended. The Completer asks a generator what it can do (`drafts`,
    `constrains`, `resumable`), never which kind it is; this base class is one that can do
    none of it (a subclass declares what it adds).
    """

    drafts = False  # it uses Ditto's drafters (and so the n-gram index of the open buffers)
    constrains = False  # token healing's mask applies (else only trailing blanks are healed)
    # It keeps each document's KV cache in this process: a prompt can be prefilled ahead (`warm`), and a
    # generation paused at a deadline (`generate(pause=...)`) goes on later (`resume`).
    resumable = False
    engine = None  # the local engine (lsp_server/decoding/engine.py), None where the model runs elsewhere
    # The policy that prices drafts (lsp_server/decoding/speculation.py), None where Ditto does not draft.
    speculation = None

    def generate(self, prompt, *, options: DecodeOptions, done: Callable[[str], bool], drafter=None,
                 cancel: threading.Event | None = None, cache_key: str | None = None, constraint=None,
                 pause: Callable[[list[int]], bool] | None = None, ctx=None) -> Generated:
        raise NotImplementedError

    def forget(self, key: str) -> None:
        """A document closed: drop what is kept for `key`."""

    # Whether `stats` may be called from another thread while the generator runs (behind a lock of its
    # own); else the server reads it only on the model worker (lsp_server/lsp/worker/state.py `report`).
    live_stats = False

    def stats(self, intervals: bool = False) -> dict | None:
        """Counts of its own for `ditto/stats` (a remote engine's), or None."""
        return None

    def cache_stats(self) -> dict | None:
        """The KV caches kept in this process ({"keys", "tokens"}), or None."""
        return None

    @property
    def stale_passes(self) -> int:
        """Model passes begun in this process after their request was cancelled, so far (a request's
        are the difference over its run: the server counts them, lsp_server/lsp/suggest.py)."""
        return 0

    # -- resumable generators only -------------------------------------------------------------
    def warm(self, ids: list[int], key: str, *, cancel: threading.Event | None = None, chunk: int = 32, ctx=None):
        """Prefill `ids` (all but the last) into the cache of `key`; the prefill's Stats."""
        raise NotImplementedError

    def cached_ids(self, key: str) -> list[int]:
        return []

    def paused(self, key: str) -> bool:
        return False

    def resume(self, key: str, *, pause: Callable[[list[int]], bool] | None = None,
               cancel: threading.Event | None = None, ctx=None):
        return None

    def seed(self, key: str, prefix, ids: list[int]) -> int:
        """Start the cache of `key` from a copy of a file's prefix KV (lsp_server/decoding/prefix.py); tokens copied."""
        return 0

    def fill(self, prefix, ids: list[int], *, cancel: threading.Event | None = None, chunk: int = 32, ctx=None):
        """Fill a file's prefix KV with `ids` (lsp_server/decoding/prefix.py `fill`); the prefill's Stats."""
        raise NotImplementedError


class GeneratingModel:
    """Base class of the models that generate elsewhere (a remote engine): the text side
    (`Tokenizer`) plus `generator()`, the Completer's generation step."""

    def generator(self) -> Generator:
        raise NotImplementedError


# (prefix, suffix, middle, file separator) as different model families name them.
FIM_NAMES = [
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|file_sep|>"),  # Qwen2.5-Coder
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>"),  # StarCoder(2), SantaCoder
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", None),  # DeepSeek-Coder
    ("▁<PRE>", "▁<SUF>", "▁<MID>", None),  # CodeLlama
    ("<PRE>", "<SUF>", "<MID>", None),
]

# Tokens that end a suggestion wherever the vocabulary has them.
STOP_NAMES = ("<|endoftext|>", "<|im_end|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<|fim_prefix|>",
              "<|fim_suffix|>", "<|fim_middle|>", "<fim_pad>", "<file_sep>", "<|end_of_text|>", "<EOT>",
              "▁<EOT>", "<｜end▁of▁sentence｜>")


def find_fim_tokens(vocab: dict[str, int]) -> FimTokens | None:
    """The FIM tokens a vocabulary (token text -> id) defines; None if it has none."""
    for p, s, m, f in FIM_NAMES:
        ids = [vocab.get(t) for t in (p, s, m)]
        if all(i is not None for i in ids):
            return FimTokens(int(ids[0]), int(ids[1]), int(ids[2]),
                             int(vocab[f]) if f and vocab.get(f) is not None else None)
    return None


def stop_token_ids(vocab: dict[str, int], eos: Sequence[int] = (), fim: FimTokens | None = None) -> frozenset[int]:
    """End-of-text ids: the model's own `eos`, every STOP_NAMES token it has, and its FIM tokens."""
    stop = {int(t) for t in eos if isinstance(t, int)}
    stop.update(int(vocab[n]) for n in STOP_NAMES if vocab.get(n) is not None)
    if fim is not None:
        stop.update(t for t in (fim.prefix, fim.suffix, fim.middle, fim.file_sep) if t is not None)
    return frozenset(stop)
