"""How the text typed on the cursor line ends a prompt (`healed_tail`): token healing's tail.

The prompt ends at the last token boundary before the cursor and the model writes the rest under a
constraint (lsp_server/decoding/healing.py; docs/design.md, "Token healing"), so `e` can become
`else` and the prompt stays the same while the user types inside a word. Its own module beside the
layout (context.py, which imports it) so that each stays small.

Left out on purpose: the constraint itself (decoding/healing.py), the rest of the prompt (context.py).
"""

from __future__ import annotations


def healed_tail(lm, tail: str, heal: str) -> tuple[list[int], str]:
    """(ids of the typed text the prompt ends with, the text left out for the model to write).

    "token": `tail` tokenized whole, less its last token (guidance's token healing), and
    less more tokens while the kept ones would end inside a multi-byte character; while
    the user types inside a word the kept ids do not change, so the prompt and its KV
    cache stay the same until a token completes. Not healed when the kept ids do not spell
    a prefix of the text (a tokenizer that normalises). "blanks": trailing blanks only.
    """
    if heal == "token" and tail and not tail.strip(" \t"):
        # Indentation alone: keep the blanks' tokens as the tokenizer writes them before a word (Qwen:
        # all but the last, which goes with the word, " self"); healing them all made the default
        # model write blanks to the token limit (docs/design.md, "Token healing").
        table, full, kept, n = lm.token_bytes(), tail.encode("utf-8"), [], 0
        for t in lm.encode(tail + "a"):
            piece = table[t] if t < len(table) else b""
            if n + len(piece) >= len(full) or not full.startswith(piece, n):
                break  # (something is always left for the model to write: the last blank at least)
            kept.append(t)
            n += len(piece)
        return kept, full[n:].decode("utf-8")
    if heal == "blanks":
        bare = tail.rstrip(" \t")
        return (lm.encode(bare) if bare else []), tail[len(bare):]
    if heal != "token" or not tail:
        return (lm.encode(tail) if tail else []), ""
    ids = lm.encode(tail)
    table = lm.token_bytes()
    full = tail.encode("utf-8")
    keep = len(ids) - 1
    while keep >= 0:
        kept = b"".join(table[t] if t < len(table) else b"" for t in ids[:keep])
        if not full.startswith(kept):
            return ids, ""  # the ids do not spell the text byte for byte: no healing
        try:
            return ids[:keep], full[len(kept):].decode("utf-8")
        except UnicodeDecodeError:  # the kept ids end inside a character: back up one more
            keep -= 1
    return ids, ""
