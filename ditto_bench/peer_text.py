"""llama.vim's text rules, ported (`autoload/llama.vim` at a1c8e6e4; Lnnn are its lines): what its
client sends and shows, as functions of a buffer, with no state and no HTTP.

Its configuration (`DEFAULT_CONFIG`) and the fields it asks the server for, a Vim `Buffer`, the
similarity of two chunks of lines (`chunk_sim`, the ring's eviction test), the local context of a
request (`fim_ctx_local`), the keys a suggestion is cached under (`hashes`), and the filtering of
an answer's `content` into the suggestion the user sees (`render`, `FimResult`).

Left out on purpose: the client's state (the ring, the cache, the current buffer) and its requests
(peer.py `LlamaVimClient`), and the server (peer_server.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field

# L65-96: s:default_config, the values that matter for FIM.
DEFAULT_CONFIG = {
    "n_prefix": 256,
    "n_suffix": 64,
    "n_predict": 128,
    "stop_strings": [],
    "t_max_prompt_ms": 500,  # sent, but the server does not implement it
    "t_max_predict_ms": 1000,
    "auto_fim": True,
    "max_line_suffix": 8,
    "max_cache_keys": 250,
    "ring_n_chunks": 16,
    "ring_chunk_size": 64,
    "ring_scope": 1024,
    "ring_update_ms": 1000,
    "model_fim": "",
    "api_key": "",
}

# L812-824: the fields llama.vim asks the server to return.
RESPONSE_FIELDS = [
    "content",
    "timings/prompt_n",
    "timings/prompt_ms",
    "timings/prompt_per_token_ms",
    "timings/prompt_per_second",
    "timings/predicted_n",
    "timings/predicted_ms",
    "timings/predicted_per_token_ms",
    "timings/predicted_per_second",
    "truncated",
    "tokens_cached",
]

_WS_LINE = re.compile(r"[ \t]*")  # Vim's '^\s*$' (\s is space or tab), used with fullmatch
_LEAD_WS = re.compile(r"^[ \t]*")
_NONWORD = re.compile(r"[^0-9A-Za-z_]+")  # Vim's \W


def context_hash(prefix_and_middle: str, suffix: str) -> str:
    """The key llama.vim caches a suggestion under (L751-763): sha256 of prefix + middle + "Î" + suffix."""
    return hashlib.sha256((prefix_and_middle + "Î" + suffix).encode("utf-8")).hexdigest()


def _blank(s: str) -> bool:
    return _WS_LINE.fullmatch(s) is not None


def chunk_sim(c0: list[str], c1: list[str]) -> float:
    """L397-422: 2 * (tokens of c1 found in c0's set) / (tokens of c0 + tokens of c1)."""
    t0 = [t for t in _NONWORD.split("\n".join(c0)) if t]
    t1 = [t for t in _NONWORD.split("\n".join(c1)) if t]
    if not t0 and not t1:
        return 1.0
    s0 = set(t0)
    return 2.0 * sum(1 for t in t1 if t in s0) / (len(t0) + len(t1))


class Buffer:
    """A Vim buffer: name (expand('%')), lines, 1-based cursor line, modified flag."""

    def __init__(self, name: str, text: str, cursor_y: int = 1, modified: bool = False):
        self.name = name
        self.set_text(text)
        self.cursor_y = cursor_y
        self.modified = modified

    def set_text(self, text: str) -> None:
        lines = text.split("\n")
        if len(lines) > 1 and lines[-1] == "":
            lines.pop()  # a trailing newline is not one more line in Vim
        self.lines = lines

    def getline(self, a: int, b: int | None = None):
        """Vim's getline(a) -> str and getline(a, b) -> list (1-based, inclusive, clipped)."""
        if b is None:
            return self.lines[a - 1] if 1 <= a <= len(self.lines) else ""
        a, b = max(a, 1), min(b, len(self.lines))
        return self.lines[a - 1 : b] if a <= b else []

    def line_count(self) -> int:  # line('$')
        return len(self.lines)


@dataclass
class FimResult:
    """One suggestion shown (or one request sent) and what the server said about it."""

    content: str = ""  # the server's raw "content"
    lines: list = field(default_factory=list)  # the rendered suggestion (s:fim_render), line_cur_suffix appended
    line_cur_suffix: str = ""  # the text after the cursor that rendering appended to the last line
    can_accept: bool = False
    from_cache: bool = False  # shown from the client cache (s:fim_try_hint) before any answer
    sent: bool = False  # shown from the answer to a request sent for this event
    wall_ms: float = 0.0  # time to display: the cache lookup, or the request that produced it
    timings: dict = field(default_factory=dict)  # prompt_n, prompt_ms, predicted_n, predicted_ms, ...
    tokens_cached: int | None = None
    tokens_evaluated: int | None = None  # the prompt's tokens (the context the model saw)
    truncated: bool | None = None
    stop_type: str | None = None
    request: dict | None = None
    sent_fim: "FimResult | None" = None  # the plain /infill request of this event, if one was sent
    followup: tuple | None = None  # (pos_x, pos_y, content): the follow-up llama.vim launches after an answer

    @property
    def text(self) -> str:
        """What accepting would insert at the cursor: the rendered lines without the appended line suffix."""
        shown = "\n".join(self.lines)
        return shown[: len(shown) - len(self.line_cur_suffix)] if self.line_cur_suffix else shown


def fim_ctx_local(b: Buffer, cfg: dict, pos_x: int, pos_y: int, prev: list[str] | None, indent_last: int) -> dict:
    """L607-679: prefix (lines above), middle (the line up to the cursor), suffix, indent (`indent_last`
    for the follow-up, the one of the request before)."""
    max_y = b.line_count()
    if not prev:
        line_cur = b.getline(pos_y)
        line_cur_prefix, line_cur_suffix = line_cur[:pos_x], line_cur[pos_x:]
        lines_prefix = b.getline(max(1, pos_y - cfg["n_prefix"]), pos_y - 1)
        lines_suffix = b.getline(pos_y + 1, min(max_y, pos_y + cfg["n_suffix"]))
        if _blank(line_cur):  # a line of blanks: start from the beginning of the line
            indent, line_cur_prefix, line_cur_suffix = 0, "", ""
        else:
            indent = len(_LEAD_WS.match(line_cur).group(0))
    else:  # as if the suggestion `prev` were accepted (the speculative follow-up)
        line_cur = b.getline(pos_y) + prev[0] if len(prev) == 1 else prev[-1]
        line_cur_prefix, line_cur_suffix = line_cur, ""
        lines_prefix = b.getline(max(1, pos_y - cfg["n_prefix"] + len(prev) - 1), pos_y - 1)
        if len(prev) > 1:
            lines_prefix.append(b.getline(pos_y) + prev[0])
            lines_prefix.extend(prev[1:-1])  # Vim's prev[1:-2] is inclusive
        lines_suffix = b.getline(pos_y + 1, min(max_y, pos_y + cfg["n_suffix"]))
        indent = indent_last
    return {"prefix": "\n".join(lines_prefix) + "\n", "middle": line_cur_prefix,
            "suffix": line_cur_suffix + "\n" + "\n".join(lines_suffix) + "\n", "indent": indent,
            "line_cur": line_cur, "line_cur_prefix": line_cur_prefix, "line_cur_suffix": line_cur_suffix}


def hashes(ctx: dict) -> list[str]:
    """L751-763: the context's hash and those of the context with 1-3 first lines trimmed."""
    prefix, middle, suffix = ctx["prefix"], ctx["middle"], ctx["suffix"]
    out = [context_hash(prefix + middle, suffix)]
    trimmed = prefix
    for _ in range(3):
        trimmed = re.sub(r"^[^\n]*\n", "", trimmed, count=1)
        if not trimmed:
            break
        out.append(context_hash(trimmed + middle, suffix))
    return out


def render(b: Buffer, pos_x: int, pos_y: int, raw: str) -> tuple[FimResult, dict]:
    """The suggestion filtering of s:fim_render (L1020-1153) in buffer `b`: the suggestion shown and
    llama.vim's s:fim_data for it."""
    resp = json.loads(raw)
    content = resp.get("content", "").split("\n")
    while content and content[-1] == "":  # trailing new lines
        content.pop()
    can_accept = True
    if not content:
        content, can_accept = [""], False
    line_cur = b.getline(pos_y)
    if _blank(line_cur):  # a line of blanks: trim as much of the suggestion's leading blanks
        lead = min(len(_LEAD_WS.match(content[0]).group(0)), len(line_cur))
        line_cur, content[0] = content[0][:lead], content[0][lead:]
    line_cur_prefix, line_cur_suffix = line_cur[:pos_x], line_cur[pos_x:]
    # Suggestions that repeat existing text are dropped.
    if len(content) > 1 and content[0] == "" and content[1:] == b.getline(pos_y + 1, pos_y + len(content) - 1):
        content = [""]
    if len(content) == 1 and content[0] == line_cur_suffix:
        content = [""]
    cmp_y = pos_y + 1  # the first non-blank line below
    while cmp_y < b.line_count() and _blank(b.getline(cmp_y)):
        cmp_y += 1
    if line_cur_prefix + content[0] == b.getline(cmp_y):
        if len(content) == 1:
            content = [""]
        if len(content) == 2 and content[-1] == b.getline(cmp_y + 1)[: len(content[-1])]:
            content = [""]
        if len(content) > 2 and "\n".join(content[1:]) == "\n".join(b.getline(cmp_y + 1, cmp_y + len(content) - 1)):
            content = [""]
    content[-1] += line_cur_suffix
    if _blank("\n".join(content)):  # only blanks: shown, not acceptable
        can_accept = False
    res = FimResult(content=resp.get("content", ""), lines=content, line_cur_suffix=line_cur_suffix,
                    can_accept=can_accept)
    res.timings = {k.split("/", 1)[1]: v for k, v in resp.items() if k.startswith("timings/")}
    res.tokens_cached, res.stop_type = resp.get("tokens_cached"), resp.get("stop_type")
    return res, {"pos_x": pos_x, "pos_y": pos_y, "line_cur": line_cur, "can_accept": can_accept, "content": content}
