"""The bytes each token id of a transformers tokenizer writes (token healing's table,
lsp_server/decoding/healing.py; TorchModel.token_bytes). Moved out of model.py to keep it short.
Left out on purpose: everything else of the backend (model.py).
"""

from __future__ import annotations


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet read back: the character standing for each byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars)}


def hf_token_bytes(tok, size: int) -> list[bytes]:
    """The bytes of ids 0..size-1 of a transformers tokenizer: byte-level BPE (Qwen, StarCoder,
    DeepSeek) through its byte alphabet, SentencePiece (CodeLlama) through "▁" and <0xNN>
    tokens, else the id's decoded text. Special and added control tokens write b"" (healing
    never lets them stand for typed text; lsp_server/decoding/healing.py)."""
    pieces = tok.convert_ids_to_tokens(list(range(min(size, len(tok)))))
    special = set(tok.all_special_ids) | {i for i, t in tok.added_tokens_decoder.items() if t.special}
    decoder = _byte_decoder()
    byte_level = sum(1 for p in pieces[:2000] if p and all(c in decoder for c in p)) > 0.9 * min(2000, len(pieces))
    out: list[bytes] = []
    for i, piece in enumerate(pieces):
        if i in special or piece is None:
            out.append(b"")
        elif byte_level and all(c in decoder for c in piece):
            out.append(bytes(decoder[c] for c in piece))
        elif piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:
            out.append(bytes([int(piece[3:5], 16)]))
        elif "▁" in piece:
            out.append(piece.replace("▁", " ").encode("utf-8"))
        else:
            text = tok.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            out.append(b"" if "\ufffd" in text else text.encode("utf-8"))
    return out + [b""] * (size - len(out))
