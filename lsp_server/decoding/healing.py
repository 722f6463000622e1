"""Token healing: the first generated tokens are constrained to extend what the user typed.

When the text before the cursor ends inside a token (`e` of `else`, `sel` of `self`), a
prompt that ends with those characters as tokens makes the model continue after a
complete token: it writes `e = []` where `else:` was meant. The prompt therefore ends at
the last token boundary before the cursor (lsp_server/completion/context.py, `build_prompt`
with `heal="token"`), and the text it backed over, the *healed bytes*, must be written by
the model itself: while some of them are still unwritten, only tokens whose bytes are
consistent with them may be generated,

    token bytes t allowed  <=>  t starts with the rest  or  the rest starts with t  (t not empty)

and the rest shrinks by what each token wrote. Stop tokens and special tokens (empty
bytes here) are not allowed until the typed text is written. This is guidance's token
healing, in bytes, so that a multi-byte character split over byte tokens heals too.

The mask is part of what "the model would write": the engine applies it to every row of
every pass while healing lasts, plain and speculative, greedy and sampling, so
speculation stays exact (lsp_server/decoding/engine.py). A row after a draft token the
mask forbids is never used (that draft token is rejected there), so it is left unmasked.

Left out on purpose: where the healed text comes from (the prompt builder) and token
texts (a backend's `vocab_bytes()`, lsp_server/backends/base.py).
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from typing import Sequence

import torch


class VocabBytes:
    """The bytes of every token id (b"" for special tokens), indexed for prefix queries."""

    def __init__(self, table: Sequence[bytes]):
        self.table = list(table)
        order = sorted((b, i) for i, b in enumerate(self.table) if b)
        self._sorted = [b for b, _ in order]
        self._ids = [i for _, i in order]
        self._exact: dict[bytes, list[int]] = {}
        for b, i in order:
            self._exact.setdefault(b, []).append(i)
        self._cache: OrderedDict[bytes, torch.Tensor] = OrderedDict()

    def __len__(self) -> int:
        return len(self.table)

    def allowed(self, rest: bytes) -> torch.Tensor:
        """Ids of the tokens allowed while `rest` is still to be written (module docstring)."""
        hit = self._cache.get(rest)
        if hit is not None:
            self._cache.move_to_end(rest)
            return hit
        # Tokens that start with `rest` are one range of the sorted table: [rest, successor(rest)).
        lo = bisect.bisect_left(self._sorted, rest)
        hi = len(self._sorted) if (up := _successor(rest)) is None else bisect.bisect_left(self._sorted, up)
        ids = list(self._ids[lo:hi])
        for n in range(1, len(rest)):  # tokens that are a proper prefix of `rest`
            ids.extend(self._exact.get(rest[:n], ()))
        out = torch.tensor(sorted(set(ids)), dtype=torch.long)
        self._cache[rest] = out
        while len(self._cache) > 256:
            self._cache.popitem(last=False)
        return out

    def step(self, rest: bytes, token: int) -> bytes | None:
        """What is left of `rest` after `token` was written; None when the token does not fit it."""
        b = self.table[token] if 0 <= token < len(self.table) else b""
        if not b:
            return None
        if b.startswith(rest):
            return b""
        if rest.startswith(b):
            return rest[len(b):]
        return None


def _successor(prefix: bytes) -> bytes | None:
    """The smallest byte string greater than every string that starts with `prefix` (None: none is)."""
    while prefix and prefix[-1] == 0xFF:
        prefix = prefix[:-1]
    return prefix[:-1] + bytes([prefix[-1] + 1]) if prefix else None


class Healing:
    """The constraint of one completion: the healed bytes and the vocabulary they are checked against."""

    def __init__(self, vocab: VocabBytes, healed: bytes):
        self.vocab = vocab
        self.healed = healed

    def start(self) -> bytes | None:
        """The rest to write at the start of generation; None when nothing is constrained."""
        return self.healed or None

    def mask(self, logits: torch.Tensor, rest: bytes | None, draft: Sequence[int]) -> torch.Tensor:
        """`logits` [k + 1, V] of a pass over [last] + draft with the rows that healing still
        constrains masked (forbidden tokens at -inf). Row i follows draft[:i]."""
        if rest is None:
            return logits
        out = None
        for i in range(logits.shape[0]):
            if rest is None or rest == b"":
                break
            ids = self.vocab.allowed(rest)
            ids = ids[ids < logits.shape[1]]
            if len(ids) == 0:  # no token can write it (not in this vocabulary): leave the row as it is
                break
            if out is None:
                out = logits.clone()
            row = torch.full_like(out[i], float("-inf"))
            row[ids] = out[i, ids]
            out[i] = row
            if i < len(draft):
                rest = self.vocab.step(rest, draft[i])
        return logits if out is None else out

    def advance(self, rest: bytes | None, tokens: Sequence[int]) -> bytes | None:
        """The rest after `tokens` were generated; None once healing is over (written, or not
        writable at all: the next rows are unconstrained)."""
        for t in tokens:
            if not rest:
                return None
            rest = self.vocab.step(rest, t)
        return rest or None
