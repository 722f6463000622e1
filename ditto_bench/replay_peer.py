"""The peer in the editor replay: llama-server (peer.py) driven as the llama.vim plugin drives it.

`PeerDriver` starts the server pinned to the replay's second core, enters the other buffers and
flushes llama.vim's ring of extra context on open, turns each edit into llama.vim's view of the
buffer (it sends nothing on a change), sends ring ticks only in pauses of 3 s or more, and makes
one CursorMovedI per request; its suggestion is llama.vim's own rendering. `peer_gguf` finds the
GGUF file Ditto's model spec names, so both load the same weights.

Left out on purpose: llama.vim's port itself (peer.py), the script (replay_script.py) and Ditto's
driver (replay_ditto.py).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from ditto_bench.replay_script import Ask, Edit, Open, Pause, ReplayOptions
from ditto_bench.systems import REPLAY_PEER as PEER


class PeerDriver:
    """llama-server (ditto_bench/peer.py) driven as llama.vim drives it."""

    system = PEER

    def __init__(self, options: ReplayOptions, gguf: str):
        self.opts = options
        self.gguf = gguf
        self.server = None
        self.client = None
        self.info: dict = {}
        self._followup: threading.Thread | None = None

    def start(self) -> None:
        from ditto_bench.peer_server import PeerServer

        o = self.opts
        self.server = PeerServer(self.gguf, core=o.cores[1], n_ctx=o.peer_ctx,
                                 log_path=o.log_dir / f"{PEER}.log" if o.log_dir else None)
        url = self.server.start()
        try:
            from importlib import metadata

            version = metadata.version("xllamacpp")
        except Exception:  # noqa: BLE001  (only a label)
            version = None
        self.info = {"system": PEER, "command": self.server.command, "url": url, "gguf": str(self.gguf),
                     "core": o.cores[1], "threads": 1, "n_ctx": o.peer_ctx, "n_batch": 1024, "n_ubatch": 1024,
                     "n_cache_reuse": 256, "xllamacpp": version, "followup": o.followup,
                     "client": "ditto_bench/peer.py, llama.vim a1c8e6e4"}

    def stop(self) -> None:
        self._join_followup()
        if self.server is not None:
            self.server.stop()
            self.server = None

    def open(self, step: Open, repo: str) -> dict:
        from ditto_bench.peer import LlamaVimClient

        self.client = LlamaVimClient(self.server.url, seed=0, timeout=self.opts.answer_timeout_s,
                                     extra_fields=("stop_type", "tokens_evaluated"))
        t0 = time.monotonic()
        for path, text in step.buffers:
            self.client.buf_enter(path, text, 1)
        self.client.buf_enter(step.path, step.text, 1)
        n = self.client.ring_flush()
        return {"ring_updates": n, "ring_flush_ms": round((time.monotonic() - t0) * 1000, 1),
                "ring_chunks": len(self.client.ring_chunks)}

    def close(self) -> None:
        self._join_followup()
        self.client = None

    def edit(self, step: Edit) -> None:
        self.client.set_current(step.document, step.cursor[0] + 1, modified=True)

    def pause(self, step: Pause) -> None:
        total = step.seconds * self.opts.pause_scale
        # Ring ticks (every ring_update_ms) send in insert mode only once the cursor rested 3 s (L531).
        from ditto_bench.peer import RING_IDLE_S

        if total < RING_IDLE_S:
            time.sleep(total)
            return
        time.sleep(RING_IDLE_S)
        waited = RING_IDLE_S
        while waited + 1.0 <= total:
            t = time.monotonic()
            self.client.ring_update(insert_mode=True, idle_s=waited)
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t)))
            waited += 1.0
        time.sleep(max(0.0, total - waited))

    def _join_followup(self) -> None:
        if self._followup is not None:
            self._followup.join()
            self._followup = None

    def ask(self, step: Ask) -> dict:
        t0 = time.perf_counter()
        self._join_followup()  # llama.vim defers a request while one is in flight (L714-722)
        try:
            res = self.client.on_insert_move(step.col, step.line + 1, followup=self.opts.followup, t0=t0)
        except TimeoutError:
            return {"timeout": True, "tts_ms": None, "text": ""}
        if self.opts.followup and res.followup is not None:
            self._followup = threading.Thread(target=self.client.send_followup, args=res.followup, daemon=True)
            self._followup.start()
        text = res.text if res.can_accept else ""
        sent = res.sent_fim
        return {
            "timeout": False, "tts_ms": round(res.wall_ms, 1), "text": text,
            "typethrough": res.from_cache,  # shown from llama.vim's cache before any answer
            "prompt_tokens_processed": sent.timings.get("prompt_n") if sent else None,
            "prompt_tokens": sent.tokens_evaluated if sent else None,  # the context the model saw
            "tokens_cached": sent.tokens_cached if sent else None,
            "generated": sent.timings.get("predicted_n") if sent else None,
            "prefill_ms": sent.timings.get("prompt_ms") if sent else None,
            "decode_ms": sent.timings.get("predicted_ms") if sent else None,
            "stop_reason": sent.stop_type if sent else None,
            "raw": res.content,
            "request_sent": sent is not None,
            "request_ms": round(sent.wall_ms, 1) if sent else None,
        }


def peer_gguf(model: str, workdir: Path) -> str:
    """The GGUF file the peer loads for Ditto's model spec (the same file Ditto's llama.cpp backend reads)."""
    from lsp_server.backends.specs import parse_spec

    spec = parse_spec(model)
    if spec.kind == "packaged":
        from lsp_server.backends.packaged import PACKAGED, packaged_gguf

        return str(packaged_gguf(PACKAGED[spec.spec], lambda *a, **k: None))
    if spec.kind == "gguf":
        return str(spec.path)
    if spec.kind == "tiny":  # tests: the tiny random model written as a GGUF
        from lsp_server.backends.tiny_gguf import write_tiny_gguf

        workdir.mkdir(parents=True, exist_ok=True)
        return str(write_tiny_gguf(workdir / "tiny-random.gguf"))
    if spec.kind == "ollama":
        from lsp_server.backends.ollama import resolve

        return str(resolve(spec.spec)[0])
    raise ValueError(f"{PEER} needs a GGUF model (got {model!r}, a {spec.kind} model)")
