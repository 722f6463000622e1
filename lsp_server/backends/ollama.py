"""Models Ollama already pulled: `ollama:NAME[:TAG]` -> the GGUF blob in Ollama's local store.

Ollama keeps a pulled model as content-addressed blobs (docs/backends.md):

    $OLLAMA_MODELS/manifests/registry.ollama.ai/library/NAME/TAG   JSON; its "layers" list has
        one entry with mediaType application/vnd.ollama.image.model and digest sha256:<hex>
    $OLLAMA_MODELS/blobs/sha256-<hex>                              the GGUF file itself

`OLLAMA_MODELS` defaults to ~/.ollama/models. NAME may carry a namespace (`user/name`) or a
host (`host/ns/name`); TAG defaults to `latest`. The blob is read where it lies (nothing is
copied); its sha256 is checked against the digest the first time and remembered, keyed by
size and modification time, in the cache directory. A model whose vocabulary has no FIM
tokens is refused: Ditto completes between the text before and after the cursor.
Left out on purpose: reading GGUF (lsp_server/backends/llama/model.py), pulling (that is Ollama's job).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from lsp_server.backends.base import ModelError, Progress
from lsp_server.backends.packaged import cache_dir, sha256_of

OLLAMA_PREFIX = "ollama:"
MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
DEFAULT_HOST = "registry.ollama.ai"


def models_dir() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models").expanduser()


def parse(spec: str) -> tuple[str, str, str, str]:
    """`ollama:NAME[:TAG]` -> (host, namespace, name, tag)."""
    rest = spec[len(OLLAMA_PREFIX):] if spec.startswith(OLLAMA_PREFIX) else spec
    path, _, tag = rest.rpartition(":") if ":" in rest.rsplit("/", 1)[-1] else (rest, "", "latest")
    parts = [p for p in path.split("/") if p]
    if not parts or not tag or any(p in (".", "..") for p in [*parts, tag]) or len(parts) > 3:
        raise ModelError(f"bad Ollama model {spec!r}: write ollama:NAME or ollama:NAME:TAG (e.g. ollama:qwen2.5-coder:0.5b)")
    if len(parts) == 1:
        parts = [DEFAULT_HOST, "library", parts[0]]
    elif len(parts) == 2:
        parts = [DEFAULT_HOST, *parts]
    return parts[0], parts[1], parts[2], tag


def display_name(host: str, namespace: str, name: str, tag: str) -> str:
    """The short form Ollama prints: library models without host and namespace."""
    if host == DEFAULT_HOST:
        return f"{name}:{tag}" if namespace == "library" else f"{namespace}/{name}:{tag}"
    return f"{host}/{namespace}/{name}:{tag}"


def _model_layer(manifest: Path) -> dict | None:
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ModelError(f"cannot read Ollama manifest {manifest}: {err}: run `ollama pull` for it again") from None
    layers = data.get("layers") if isinstance(data, dict) else None
    for layer in layers if isinstance(layers, list) else []:
        if isinstance(layer, dict) and layer.get("mediaType") == MODEL_MEDIA_TYPE:
            return layer
    return None


def _blob_path(store: Path, digest: str) -> Path:
    algo, _, hexd = str(digest).partition(":")
    if algo != "sha256" or len(hexd) != 64 or any(c not in "0123456789abcdef" for c in hexd):
        raise ModelError(f"Ollama digest {digest!r} is not sha256:<64 hex digits>: the manifest is damaged; pull the model again")
    return store / "blobs" / f"sha256-{hexd}"


def resolve(spec: str, say: Progress | None = None) -> tuple[Path, str]:
    """(path of the GGUF blob, display name) for `ollama:NAME[:TAG]`; ModelError with one line if absent."""
    say = say or (lambda msg, frac: None)
    host, ns, name, tag = parse(spec)
    shown = display_name(host, ns, name, tag)
    store = models_dir()
    manifest = store / "manifests" / host / ns / name / tag
    if not manifest.is_file():
        raise ModelError(f"no Ollama model {shown} in {store} (no manifest {manifest}): run `ollama pull {shown}`, "
                         f"or set OLLAMA_MODELS to the store that holds it")
    layer = _model_layer(manifest)
    if layer is None:
        raise ModelError(f"Ollama model {shown} has no {MODEL_MEDIA_TYPE} layer in its manifest: it holds no GGUF "
                         f"weights Ditto can run")
    blob = _blob_path(store, layer.get("digest", ""))
    if not blob.is_file():
        raise ModelError(f"Ollama model {shown}: its blob {blob} is missing: run `ollama pull {shown}` again")
    size = blob.stat().st_size
    if isinstance(layer.get("size"), int) and layer["size"] != size:
        raise ModelError(f"Ollama model {shown}: blob {blob.name} has {size} bytes, the manifest says {layer['size']}: "
                         f"run `ollama pull {shown}` again")
    _check_digest(blob, blob.name.removeprefix("sha256-"), shown, say)
    return blob, shown


def _check_digest(blob: Path, want: str, shown: str, say: Progress) -> None:
    """sha256 of the blob == its name, checked once per (size, mtime) and remembered."""
    record = cache_dir() / "ollama-verified.json"
    st = blob.stat()
    stamp = [st.st_size, st.st_mtime_ns]
    try:
        seen = json.loads(record.read_text())
    except (OSError, ValueError):
        seen = {}
    if not isinstance(seen, dict):
        seen = {}
    if seen.get(str(blob)) == [want, *stamp]:
        return
    got = sha256_of([blob], say, f"checking {shown}", st.st_size)
    if got != want:
        raise ModelError(f"Ollama model {shown}: blob {blob.name} has sha256 {got[:16]}…, not the digest that names it: "
                         f"the file is damaged; run `ollama pull {shown}` again")
    seen[str(blob)] = [want, *stamp]
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        tmp = record.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(seen, indent=1))
        os.replace(tmp, record)
    except OSError:
        pass  # not remembered: checked again next time


def check_fim(lm, shown: str) -> None:
    """Refuse a model without FIM tokens (one line saying why)."""
    if lm.fim is None:
        raise ModelError(f"Ollama model {shown} has no fill-in-the-middle tokens in its vocabulary, and Ditto completes "
                         f"between the text before and after the cursor: use a code model with FIM "
                         f"(e.g. ollama:qwen2.5-coder)")


def installed() -> list[dict]:
    """The models in Ollama's store, for `ditto-lsp models list` (no digests checked)."""
    root = models_dir() / "manifests"
    rows = []
    if not root.is_dir():
        return rows
    for manifest in sorted(root.glob("*/*/*/*")):
        if not manifest.is_file():
            continue
        host, ns, name, tag = manifest.relative_to(root).parts
        shown = display_name(host, ns, name, tag)
        try:
            layer = _model_layer(manifest)
            blob = _blob_path(models_dir(), layer["digest"]) if layer else None
        except ModelError:
            layer, blob = None, None
        state = "no GGUF layer" if layer is None else ("ollama store" if blob and blob.is_file() else "blob missing")
        size = layer.get("size") if layer else None
        rows.append({"name": f"{OLLAMA_PREFIX}{shown}", "title": f"Ollama {shown}" + (f" ({size / 1e6:.0f} MB)" if isinstance(size, int) else ""),
                     "parts": state, "converted": None, "gguf": str(blob) if blob and blob.is_file() else None})
    return rows
