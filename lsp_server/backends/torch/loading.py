"""Loading a torch model: a model directory or hub id directly; a GGUF (a packaged model, joined
by lsp_server/backends/packaged.py, or a user's `.gguf`) dequantised once to float32
safetensors in the cache directory (about a minute for the 0.5B), so later starts take seconds.
Device and dtype: CUDA and bfloat16 when a GPU is there, else the CPU in float32.
"""


import contextlib
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path

import torch

from lsp_server.backends.base import (
    ModelError,
    Progress,
)
from lsp_server.backends.packaged import (
    PACKAGED,
    PackagedModel,
    converted_dir,
    is_converted,
    packaged_gguf,
    sha256_of,
)
from lsp_server.backends.specs import ModelSpec
from lsp_server.backends.torch.model import TorchModel, wrap

log = logging.getLogger(__name__)


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


def converted_packaged(pm: PackagedModel, say: Progress) -> Path:
    """The directory of `pm` converted for transformers, converted now (once) if it is not yet."""
    directory = converted_dir(pm.name, pm.sha256)
    if not is_converted(directory):
        _convert(packaged_gguf(pm, say), directory, pm.title, pm.sha256, say)
    return directory


def load_packaged(pm: PackagedModel, dev, dt, say: Progress) -> TorchModel:
    return _load_dir(converted_packaged(pm, say), pm.name, pm.title, dev, dt, False, say)


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


def load(ms: ModelSpec, device, dtype, trust_remote_code: bool, say: Progress) -> TorchModel:
    """Load a spec (lsp_server/backends/specs.py) on torch."""
    dev = choose_device(device)
    dt = choose_dtype(dtype, dev)
    if ms.kind == "tiny":
        from lsp_server.backends.tiny import tiny_random

        return tiny_random(device=dev)
    if ms.kind == "packaged":
        return load_packaged(PACKAGED[ms.spec], dev, dt, say)
    if ms.kind == "ollama":
        from lsp_server.backends.ollama import check_fim, resolve

        blob, name = resolve(ms.spec, say)
        lm = load_gguf_file(blob, ms.spec, dev, dt, say)
        lm.name = name
        check_fim(lm, name)
        return lm
    if ms.kind == "gguf":
        return load_gguf_file(ms.path, ms.spec, dev, dt, say)
    if ms.kind == "directory":
        return load_directory(ms.path, ms.spec, dev, dt, trust_remote_code, say)
    if ms.kind == "hub":
        return load_directory(ms.spec, ms.spec, dev, dt, trust_remote_code, say)
    if ms.kind == "file":
        raise ModelError(f"model spec {ms.spec!r} is a file but not a .gguf: give a .gguf file, a model directory "
                         f"or a hub id")
    raise ModelError(f"the torch backend cannot run {ms.spec!r} ({ms.kind})")
