"""The torch + transformers backend: the reference implementation and the GPU path.

Implements the interface of lsp_server/backend.py over a transformers causal LM: a
`DynamicCache` per sequence, `forward` over new tokens with logits for the last rows,
crop by dropping tokens off the end. With lsp_server/tiny.py, the only modules that
import transformers.

Loading: a model directory or hub id directly; a GGUF (a packaged model, joined by
lsp_server/packaged.py, or a user's `.gguf`) is dequantised once to float32 safetensors
in the cache directory (about a minute for the 0.5B), so later starts take seconds.
Device and dtype: CUDA and bfloat16 when a GPU is there, else the CPU in float32 (bf16
on this kind of CPU is not batch-invariant; docs/design.md, "Exactness on every backend").

Also here: `small_batch_matmul` (verify passes over 2-4 tokens through (W @ x.T).T on
the CPU; DITTO_SMALL_BATCH_MATMUL=0 turns it off) and `hf_generate`, transformers' own
`generate` on the same prompt, which the benchmark compares against.
Left out on purpose: decoding (engine.py), prompts (context.py).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Sequence

import torch

from .backend import FimTokens, ModelError, Progress, find_fim_tokens, stop_token_ids
from .packaged import PackagedModel, converted_dir, is_converted, packaged_gguf, sha256_of

log = logging.getLogger(__name__)


class TorchModel:
    """A transformers causal LM behind the backend interface (lsp_server/backend.py)."""

    kind = "torch"

    def __init__(self, spec: str, name: str, module: torch.nn.Module, tokenizer, device: torch.device,
                 dtype: torch.dtype, *, fim: FimTokens | None = None, stop_ids: frozenset[int] | None = None,
                 vocab_size: int | None = None):
        self.spec = spec
        self.name = name
        self._model = module
        self._tok = tokenizer
        self.device = device
        self.dtype = dtype
        vocab = self.vocabulary()
        self.fim = fim if fim is not None else find_fim_tokens(vocab)
        if stop_ids is None:
            eos = []
            for tid in (getattr(tokenizer, "eos_token_id", None), getattr(module.config, "eos_token_id", None)):
                eos.extend(tid if isinstance(tid, (list, tuple)) else [tid])
            stop_ids = stop_token_ids(vocab, [t for t in eos if isinstance(t, int)], self.fim)
        self.stop_ids = frozenset(stop_ids)
        self.vocab_size = int(vocab_size or module.get_output_embeddings().weight.shape[0])
        self.load_seconds = 0.0
        params = inspect.signature(module.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def with_module(self, module: torch.nn.Module, spec: str) -> "TorchModel":
        """Another model with this one's tokenizer (tests: two sets of weights, one vocabulary)."""
        return TorchModel(spec, spec, module, self._tok, self.device, self.dtype, fim=self.fim,
                          stop_ids=self.stop_ids, vocab_size=self.vocab_size)

    def save_pretrained(self, directory) -> None:
        """Write the weights and the tokenizer as a model directory transformers can load."""
        self._model.save_pretrained(directory)
        self._tok.save_pretrained(directory)

    def describe(self) -> dict:
        return {"backend": self.kind, "device": str(self.device), "dtype": str(self.dtype).removeprefix("torch.")}

    # -- text side ---------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def token_text(self, tid: int) -> str:
        return self.decode([tid])

    def vocabulary(self) -> dict[str, int]:
        return dict(self._tok.get_vocab()) if self._tok is not None else {}

    def special_ids(self) -> dict[str, int | None]:
        return {a: getattr(self._tok, a, None) for a in ("eos_token_id", "bos_token_id", "pad_token_id",
                                                          "unk_token_id")}

    # -- tensor side -------------------------------------------------------------------
    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self._model.config)

    @torch.inference_mode()
    def forward(self, ids: Sequence[int], cache, last: int) -> torch.Tensor:
        """Run the model over `ids` (new tokens after what `cache` holds).

        Returns float32 logits [last, vocab] for the last `last` positions, on the model's device.
        """
        if not 1 <= last <= len(ids):
            raise ValueError(f"last must be in 1..{len(ids)}, got {last}")
        x = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        out = self._model(input_ids=x, use_cache=True, logits_to_keep=last, **{self._cache_kw: cache})
        return out.logits[0, -last:].float()

    def crop(self, cache, keep: int) -> None:
        drop = cache.get_seq_length() - keep
        if drop > 0:
            cache.crop(-drop)

    def release(self, cache) -> None:
        pass  # a DynamicCache is plain tensors: garbage collection frees it


# ------------------------------------------------------------------------------------
# Loading
# ------------------------------------------------------------------------------------


def choose_device(device: str | None) -> torch.device:
    if device and device != "auto":
        try:
            dev = torch.device(device)
        except RuntimeError as err:
            raise ModelError(f"unknown device {device!r} ({err}): use auto, cpu, cuda or cuda:N") from None
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ModelError(f"device {device!r} asked for, but torch sees no CUDA GPU: use --device cpu")
        return dev
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


def choose_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    if dtype and dtype != "auto":
        if dtype not in _DTYPES:
            raise ModelError(f"unknown dtype {dtype!r}: use auto, float32, bfloat16 or float16")
        return _DTYPES[dtype]
    # bf16 on a GPU; float32 on a CPU (bf16 there is not batch-invariant; docs/design.md, "Exactness").
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_packaged(pm: PackagedModel, dev, dt, say: Progress) -> TorchModel:
    directory = converted_dir(pm.name, pm.sha256)
    if not is_converted(directory):
        _convert(packaged_gguf(pm, say), directory, pm.title, pm.sha256, say)
    return _load_dir(directory, pm.name, pm.title, dev, dt, False, say)


def load_gguf_file(path: Path, spec: str, dev, dt, say: Progress) -> TorchModel:
    if not path.is_file():
        raise ModelError(f"model file {str(path)!r} does not exist: give the path of a .gguf file")
    sha = sha256_of([path], say, path.name, path.stat().st_size)
    directory = converted_dir(path.stem, sha)
    if not is_converted(directory):
        _convert(path, directory, path.stem, sha, say)
    return _load_dir(directory, spec, path.stem, dev, dt, False, say)


def load_directory(source, spec: str, dev, dt, trust_remote_code: bool, say: Progress) -> TorchModel:
    """A local model directory (never touches the network) or a hub id."""
    name = Path(str(source)).name if isinstance(source, Path) else str(source)
    return _load_dir(source, spec, name, dev, dt, trust_remote_code, say)


def _load_dir(source, spec: str, name: str, dev, dt, trust_remote_code: bool, say: Progress) -> TorchModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    say(f"loading {name}", None)
    offline = not isinstance(source, str)
    try:
        # A local directory never touches the network (local_files_only); only a hub id may.
        with _quiet_transformers():
            tok = AutoTokenizer.from_pretrained(str(source), trust_remote_code=trust_remote_code,
                                                local_files_only=offline)
            model = AutoModelForCausalLM.from_pretrained(
                str(source), dtype=dt, trust_remote_code=trust_remote_code, low_cpu_mem_usage=True,
                local_files_only=offline,
            )
    except OSError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        where = "directory" if offline else "hub id (is it spelled right, and is the hub reachable?)"
        raise ModelError(f"cannot load model {spec!r} from {where}: {first}") from None
    except ValueError as err:
        first = str(err).strip().splitlines()[0]
        raise ModelError(f"cannot load model {spec!r}: {first}") from None
    model.to(dev).eval()
    return wrap(spec, name, model, tok, dev, dt)


def wrap(spec, name, model, tok, dev, dt) -> TorchModel:
    lm = TorchModel(spec, name, model, tok, dev, dt)
    if dev.type == "cpu" and os.environ.get("DITTO_SMALL_BATCH_MATMUL", "1") != "0":
        small_batch_matmul(model)
    return lm


def small_batch_matmul(model: torch.nn.Module, rows: tuple[int, int] = (2, 4)) -> int:
    """Compute the linear layers of a verify pass over 2-4 tokens as (W @ x.T).T on the CPU.

    Through F.linear a pass over 2-4 new tokens costs about 2-2.8x a one-token pass on
    this kind of CPU; the transposed product costs 1.6-1.9x (measured on
    Qwen2.5-Coder-0.5B, float32, one thread), which is what decides whether a short
    draft pays. One token and longer passes keep F.linear, which is faster there. The
    logits stay within the batch-invariance the engine relies on (the equivalence tests
    run with this on). Returns how many layers were changed; DITTO_SMALL_BATCH_MATMUL=0
    turns it off.
    """
    lo, hi = rows
    linear = torch.nn.functional.linear

    def forward(self, x):
        n = x.numel() // x.shape[-1] if x.dim() else 0
        if lo <= n <= hi and x.dtype == torch.float32:
            y = (self.weight @ x.reshape(n, x.shape[-1]).T).T.reshape(*x.shape[:-1], self.weight.shape[0])
            return y + self.bias if self.bias is not None else y
        return linear(x, self.weight, self.bias)

    count = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.forward = forward.__get__(module)
            count += 1
    return count


def _convert(gguf: Path, target: Path, title: str, sha: str, say: Progress) -> None:
    """Dequantise a GGUF with transformers and save it as safetensors (fp32) + tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    say(f"converting {title} from GGUF (once; about a minute)", None)
    t0 = time.monotonic()
    try:
        with _quiet_transformers():
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    except Exception as err:  # gguf parsing raises many kinds; the user needs one line
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ModelError(f"cannot read GGUF {gguf.name}: {first}: is it a complete GGUF file of a supported model?") from None
    # transformers refuses save_pretrained on a GGUF-loaded model until these go.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        with _quiet_transformers():
            model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "ditto.json").write_text(json.dumps({"title": title, "gguf_sha256": sha, "converted_s": round(time.monotonic() - t0, 1)}))
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    say(f"converted {title} in {time.monotonic() - t0:.0f}s to {target}", None)


def hf_generate(lm: TorchModel, prompt_ids: list[int], max_new_tokens: int, lookup_tokens: int | None = None,
                streamer=None) -> tuple[list[int], int]:
    """transformers `generate`, greedy, on `prompt_ids` (a fresh cache, as a library user calls it).

    Returns (new ids, padding stripped, a stop token included when it ended there; forward passes run).
    `lookup_tokens`: transformers' prompt lookup (`prompt_lookup_num_tokens`).
    """
    model = lm._model
    passes = [0]
    hook = model.register_forward_pre_hook(lambda *a: passes.__setitem__(0, passes[0] + 1))
    x = torch.tensor([prompt_ids], dtype=torch.long, device=lm.device)
    pad = lm._tok.pad_token_id if lm._tok.pad_token_id is not None else min(lm.stop_ids)
    kwargs = dict(max_new_tokens=max(1, max_new_tokens), do_sample=False, temperature=None, top_p=None, top_k=None,
                  repetition_penalty=None, attention_mask=torch.ones_like(x), eos_token_id=sorted(lm.stop_ids),
                  pad_token_id=pad)
    if lookup_tokens:
        kwargs["prompt_lookup_num_tokens"] = lookup_tokens
    try:
        with torch.inference_mode():
            out = model.generate(x, streamer=streamer, **kwargs)
    finally:
        hook.remove()
    new = out[0, len(prompt_ids) :].tolist()
    while new and new[-1] == pad and pad not in lm.stop_ids:
        new.pop()
    return new, passes[0]


@contextlib.contextmanager
def _quiet_transformers():
    """No transformers progress bars or info chatter on stderr while loading: Ditto reports
    its own progress (to the terminal, or as $/progress to the editor)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()
