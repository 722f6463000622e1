"""The peer: llama.cpp's own `llama-server`, driven the way the llama.vim plugin drives it.

`LlamaVimClient` is a port of ggml-org/llama.vim `autoload/llama.vim` at commit
a1c8e6e40cb45df59b78add5b65d575386832465 (2026-01-31); the line references (Lnnn) point
into that file. It keeps llama.vim's state (the ring of extra-context chunks and its queue,
the client cache of suggestions by context hash, the last indentation) and turns editor
events into the requests llama.vim sends: `buf_enter` (BufEnter/BufLeave chunk picks),
`ring_update` (one tick of the ring timer: a chunk sent with `n_predict` 0),
`on_insert_move` (one CursorMovedI: show a cached suggestion, then `/infill` with
`t_max_predict_ms` 250) and `render` (llama.vim's own filtering of `content`, which is
the suggestion the user sees).

Its text rules (the local context, the cache keys, the rendering) are functions of a buffer in
peer_text.py; the server it talks to is peer_server.py.

Conventions: `pos_y` is 1-based (Vim's line('.')), `pos_x` 0-based (col('.') - 1). Vim
counts bytes where this port counts characters (the same for ASCII source).

Left out on purpose: Vim's timers and jobs (the replay, ditto_bench/replay.py, decides
when a ring tick happens and runs one request at a time, as llama.vim defers a request
while one is in flight, L714-722); the display itself; instruction mode; the speculative
follow-up is sent only when the caller asks (`followup`), since the replay measures the
request a place gets, not the one after it.
"""

from __future__ import annotations

import http.client
import json
import random
import time
import urllib.parse

from ditto_bench.peer_text import (
    DEFAULT_CONFIG,
    RESPONSE_FIELDS,
    Buffer,
    FimResult,
    chunk_sim,
    context_hash,
    fim_ctx_local,
    hashes,
    render,
)

RING_IDLE_S = 3.0  # L531: in insert mode a ring tick sends only after the cursor rested this long


class LlamaVimClient:
    """llama.vim's client state and requests (module docstring). One request at a time."""

    def __init__(self, base_url: str = "http://127.0.0.1:8012", config: dict | None = None, seed: int | None = 0,
                 timeout: float = 600.0, extra_fields: tuple[str, ...] = ()):
        self.base_url = base_url.rstrip("/")
        self.cfg = {**DEFAULT_CONFIG, **(config or {})}
        self.rng = random.Random(seed)
        self.timeout = timeout
        # Fields asked beyond llama.vim's own (the bench asks "stop_type"): the server only echoes more.
        self.extra_fields = list(extra_fields)
        # L271-279, L132-133
        self.ring_chunks: list[dict] = []
        self.ring_queued: list[dict] = []
        self.ring_n_evict = 0
        self.pos_y_pick = -9999
        self.indent_last = -1
        self.cache: dict[str, str] = {}
        self.cache_lru: list[str] = []
        self.fim_hint_shown = False
        self.fim_data: dict = {}
        self.buffers: dict[str, Buffer] = {}
        self.cur: Buffer | None = None
        self.log: list[dict] = []  # every HTTP request: kind, wall_ms, timings

    # -- HTTP -------------------------------------------------------------------------------
    def _post(self, path: str, body: dict) -> tuple[dict, float]:
        u = urllib.parse.urlsplit(self.base_url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=self.timeout)
        # L582-584 / L841-843: the Authorization header is always added (a string-literal test), empty by default.
        headers = {"Content-Type": "application/json", "Authorization": "Bearer " + self.cfg.get("api_key", "")}
        t0 = time.perf_counter()
        try:
            conn.request("POST", path, body=json.dumps(body).encode(), headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        wall = (time.perf_counter() - t0) * 1000.0
        if resp.status != 200:
            raise RuntimeError(f"{path} -> HTTP {resp.status}: {raw[:500]!r}")
        return json.loads(raw), wall

    # -- the suggestion cache (L135-165) ------------------------------------------------------
    def _cache_insert(self, key: str, value: str) -> None:
        if len(self.cache) > self.cfg["max_cache_keys"] - 1:
            self.cache.pop(self.cache_lru.pop(0), None)
        self.cache[key] = value
        self.cache_lru = [k for k in self.cache_lru if k != key]
        self.cache_lru.append(key)

    def _cache_get(self, key: str) -> str | None:
        if key not in self.cache:
            return None
        self.cache_lru = [k for k in self.cache_lru if k != key]
        self.cache_lru.append(key)
        return self.cache[key]

    # -- the ring of extra context ------------------------------------------------------------
    def _rand(self, i0: int, i1: int) -> int:  # L183-185
        return self.rng.randint(i0, i1)

    def pick_chunk(self, text: list[str], no_mod: bool, do_evict: bool, buf: Buffer | None = None) -> None:
        """L429-509: queue a random chunk of `text` (from `buf`, default the current buffer)."""
        buf = buf or self.cur
        if no_mod and (buf is None or buf.modified):
            return
        size = self.cfg["ring_chunk_size"]
        if self.cfg["ring_n_chunks"] <= 0 or len(text) < 3:
            return
        if len(text) + 1 < size:
            chunk = list(text)
        else:
            l0 = self._rand(0, max(0, len(text) - size // 2))
            l1 = min(l0 + size // 2, len(text))
            chunk = text[l0 : l1 + 1]  # Vim slices are inclusive
        if any(c["data"] == chunk for c in self.ring_chunks) or any(c["data"] == chunk for c in self.ring_queued):
            return
        for ring in (self.ring_queued, self.ring_chunks):  # evict very similar chunks (or give up)
            for i in range(len(ring) - 1, -1, -1):
                if chunk_sim(ring[i]["data"], chunk) > 0.9:
                    if not do_evict:
                        return
                    ring.pop(i)
                    self.ring_n_evict += 1
        if len(self.ring_queued) == 16:
            self.ring_queued.pop(0)
        self.ring_queued.append({"data": chunk, "str": "\n".join(chunk) + "\n", "time": time.time(),
                                 "filename": buf.name if buf else ""})

    def _around_cursor(self, buf: Buffer) -> list[str]:
        half = self.cfg["ring_chunk_size"] // 2
        return buf.getline(max(1, buf.cursor_y - half), min(buf.cursor_y + half, buf.line_count()))

    def ring_get_extra(self) -> list[dict]:  # L511-523
        return [{"text": c["str"], "time": c["time"], "filename": c["filename"]} for c in self.ring_chunks]

    def ring_update(self, insert_mode: bool = False, idle_s: float = float("inf")) -> dict | None:
        """One tick of the ring timer (L527-598); the log entry of the request sent, or None."""
        if insert_mode and idle_s < RING_IDLE_S:  # L531
            return None
        if not self.ring_queued:
            return None
        if len(self.ring_chunks) == self.cfg["ring_n_chunks"]:
            self.ring_chunks.pop(0)
        self.ring_chunks.append(self.ring_queued.pop(0))
        req = {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": self.ring_get_extra(), "prompt": "",
               "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": False, "cache_prompt": True,
               "t_max_prompt_ms": 1, "t_max_predict_ms": 1, "response_fields": [""],
               # L578-580: `len("g:llama_config.model_fim") > 0` tests a string literal, so "model" is always sent
               "model": self.cfg.get("model_fim", "")}
        _, wall = self._post("/infill", req)
        entry = {"kind": "ring", "wall_ms": wall, "n_chunks": len(self.ring_chunks)}
        self.log.append(entry)
        return entry

    def ring_flush(self, max_ticks: int = 1000) -> int:
        """Ticks in normal mode until the queue is empty; returns the number of updates sent."""
        n = 0
        while self.ring_queued and n < max_ticks:
            self.ring_update()
            n += 1
        return n

    # -- editor events ------------------------------------------------------------------------
    def buf_enter(self, name: str, text: str | None = None, cursor_y: int | None = None) -> Buffer:
        """BufLeave of the current buffer (L345), then BufEnter of `name` (L344; a 100 ms timer in Vim)."""
        if self.cur is not None and self.cur.name != name:
            self.pick_chunk(self._around_cursor(self.cur), True, True, self.cur)
        b = self.buffers.get(name)
        if b is None:
            b = self.buffers[name] = Buffer(name, text or "", cursor_y or 1)
        elif text is not None:
            b.set_text(text)
        if cursor_y is not None:
            b.cursor_y = cursor_y
        self.cur = b
        self.pick_chunk(self._around_cursor(b), True, True, b)
        return b

    def set_current(self, text: str, cursor_y: int, modified: bool = True) -> None:
        """An edit of the current buffer: its text and the cursor line after it."""
        self.cur.set_text(text)
        self.cur.cursor_y = cursor_y
        self.cur.modified = modified

    # -- FIM ----------------------------------------------------------------------------------

    def fim_ctx_local(self, pos_x: int, pos_y: int, prev: list[str] | None) -> dict:
        """L607-679 on the current buffer (peer_text.fim_ctx_local)."""
        return fim_ctx_local(self.cur, self.cfg, pos_x, pos_y, prev, self.indent_last)

    def build_request(self, ctx: dict, t_max_predict_ms: int) -> dict:
        """L796-825 (after the ring eviction of L778-792)."""
        return {
            "id_slot": 0,
            "input_prefix": ctx["prefix"],
            "input_suffix": ctx["suffix"],
            "input_extra": self.ring_get_extra(),
            "prompt": ctx["middle"],
            "n_predict": self.cfg["n_predict"],
            "stop": self.cfg["stop_strings"],
            "n_indent": ctx["indent"],
            "top_k": 40,
            "top_p": 0.90,
            "samplers": ["top_k", "top_p", "infill"],
            "stream": False,
            "cache_prompt": True,
            "t_max_prompt_ms": self.cfg["t_max_prompt_ms"],
            "t_max_predict_ms": t_max_predict_ms,
            "response_fields": RESPONSE_FIELDS + self.extra_fields,
            # L837-839: always present (the same string-literal test as L578), "" by default
            "model": self.cfg.get("model_fim", ""),
        }

    @staticmethod
    def hashes(ctx: dict) -> list[str]:
        """L751-763 (peer_text.hashes)."""
        return hashes(ctx)

    def fim(self, pos_x: int, pos_y: int, is_auto: bool, prev: list[str] | None, use_cache: bool) -> FimResult | None:
        """llama#fim (L701-891); None when nothing is sent (line suffix too long, or the context is cached)."""
        cfg, b = self.cfg, self.cur
        ctx = self.fim_ctx_local(pos_x, pos_y, prev)
        if is_auto and len(ctx["line_cur_suffix"]) > cfg["max_line_suffix"]:  # L737
            return None
        # L741-745: the first request at a place is quick; the follow-up gets the configured limit.
        t_max_predict_ms = cfg["t_max_predict_ms"] if prev else 250
        hashes = self.hashes(ctx)
        if use_cache and any(self._cache_get(h) is not None for h in hashes):  # L766-772
            return None
        self.indent_last = ctx["indent"]  # L775
        # L778-792: evict ring chunks similar (> 0.5) to a random chunk around the cursor.
        half = cfg["ring_chunk_size"] // 2
        text = b.getline(max(1, b.cursor_y - half), min(b.cursor_y + half, b.line_count()))
        l0 = self._rand(0, max(0, len(text) - half))
        chunk = text[l0 : min(l0 + half, len(text)) + 1]
        for i in range(len(self.ring_chunks) - 1, -1, -1):
            if chunk_sim(self.ring_chunks[i]["data"], chunk) > 0.5:
                self.ring_chunks.pop(i)
                self.ring_n_evict += 1
        req = self.build_request(ctx, t_max_predict_ms)
        resp, wall = self._post("/infill", req)
        res = FimResult(sent=True, wall_ms=wall, request=req, content=resp.get("content", ""))
        res.timings = {k.split("/", 1)[1]: v for k, v in resp.items() if k.startswith("timings/")}
        res.tokens_cached, res.truncated, res.stop_type = resp.get("tokens_cached"), resp.get("truncated"), resp.get("stop_type")
        res.tokens_evaluated = resp.get("tokens_evaluated")
        self.log.append({"kind": "fim_spec" if prev else "fim", "wall_ms": wall, **res.timings,
                         "tokens_cached": res.tokens_cached})
        # L875-890: after sending, gather chunks further away when the cursor moved far.
        if is_auto and abs(pos_y - self.pos_y_pick) > 32:
            max_y = b.line_count()
            self.pick_chunk(b.getline(max(1, pos_y - cfg["ring_scope"]), max(1, pos_y - cfg["n_prefix"])), False, False)
            self.pick_chunk(b.getline(min(max_y, pos_y + cfg["n_suffix"]),
                                      min(max_y, pos_y + cfg["n_suffix"] + cfg["ring_chunk_size"])), False, False)
            self.pos_y_pick = pos_y
        if "content" in resp:  # s:fim_on_response (L894-931): cache the answer under every hash
            raw = json.dumps(resp)
            for h in hashes:
                self._cache_insert(h, raw)
        return res

    def try_hint(self, pos_x: int, pos_y: int) -> FimResult | None:
        """s:fim_try_hint (L953-1017) without launching the follow-up: render a cached suggestion, or None.

        A suggestion cached for this exact context, or for one up to 128 characters earlier
        whose content begins with what was typed since (then shown without it).
        """
        ctx = self.fim_ctx_local(pos_x, pos_y, None)
        prefix, middle, suffix = ctx["prefix"], ctx["middle"], ctx["suffix"]
        raw = self._cache_get(context_hash(prefix + middle, suffix))
        if raw is None:
            pm = prefix + middle
            best = 0
            for i in range(128):
                removed = pm[-(1 + i) :]
                keep = len(pm) - (1 + i)
                cached = self._cache_get(context_hash(pm[:keep] if keep > 0 else "", suffix))
                if not cached:
                    continue
                r = json.loads(cached)
                if r["content"][: i + 1] != removed:
                    continue
                r["content"] = r["content"][i + 1 :]
                if r["content"]:
                    if raw is None:
                        raw = json.dumps(r)
                    elif len(r["content"]) > best:
                        best = len(r["content"])
                        raw = json.dumps(r)
        return None if raw is None else self.render(pos_x, pos_y, raw)

    def render(self, pos_x: int, pos_y: int, raw: str) -> FimResult:
        """s:fim_render (L1020-1153) on the current buffer (peer_text.render); sets fim_hint_shown and fim_data."""
        res, self.fim_data = render(self.cur, pos_x, pos_y, raw)
        self.fim_hint_shown = True
        return res

    # -- one editor event ---------------------------------------------------------------------
    def on_insert_move(self, pos_x: int, pos_y: int, followup: bool = False, t0: float | None = None) -> FimResult:
        """One CursorMovedI with auto_fim (L334-337), in Vim's order:

        1. s:on_move -> s:fim_try_hint: show a cached suggestion if there is one;
        2. llama#fim(-1, -1, v:true, [], v:true): unless the context (or one of its trimmed
           variants) is cached, send /infill (t_max_predict_ms 250); on the answer, cache it
           and, unless an acceptable suggestion is shown, render it.

        llama.vim launches its speculative follow-up whenever a suggestion is shown
        (L1012-1015). With `followup`, the one after a cached suggestion is sent here, before
        the plain request (which llama.vim defers while a request is in flight, L714-722); the
        one after an answer is left to the caller in `.followup` (pos_x, pos_y, content), to
        run while the user pauses (`send_followup`). Returns the suggestion shown (an empty
        FimResult if none): wall_ms is the time to display from `t0` (default: the call);
        .sent_fim is the plain request of this event.
        """
        t0 = time.perf_counter() if t0 is None else t0
        self.cur.cursor_y = pos_y
        self.fim_hint_shown = False  # llama#fim_hide
        shown = self.try_hint(pos_x, pos_y)
        if shown is not None:
            shown.from_cache = True
            shown.wall_ms = (time.perf_counter() - t0) * 1000.0
            if followup:
                self.send_followup(pos_x, pos_y, list(self.fim_data["content"]))
        sent = self.fim(pos_x, pos_y, True, None, True)
        if sent is not None and not (self.fim_hint_shown and self.fim_data.get("can_accept")):
            t_display = (time.perf_counter() - t0) * 1000.0
            shown = self.try_hint(pos_x, pos_y)
            if shown is not None:
                shown.sent, shown.wall_ms, shown.request = True, t_display, sent.request
                shown.timings, shown.tokens_cached = sent.timings, sent.tokens_cached
                shown.tokens_evaluated = sent.tokens_evaluated
                shown.truncated, shown.stop_type = sent.truncated, sent.stop_type
                shown.followup = (pos_x, pos_y, list(self.fim_data["content"]))
        if shown is None:
            shown = FimResult(wall_ms=(time.perf_counter() - t0) * 1000.0)
        shown.sent_fim = sent
        return shown

    def send_followup(self, pos_x: int, pos_y: int, content: list) -> FimResult | None:
        """llama.vim's speculative FIM (L1012-1015): the context as if `content` were accepted."""
        return self.fim(pos_x, pos_y, True, content, True)
