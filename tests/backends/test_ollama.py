"""`--model ollama:NAME[:TAG]` (lsp_server/backends/ollama.py) on a store laid out as Ollama lays it out.

The store is written here: a manifest per model under manifests/registry.ollama.ai/..., blobs
named by their sha256, the model layer holding the tiny GGUF (lsp_server/backends/tiny_gguf.py). No
Ollama install, no download.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lsp_server.backends import ollama
from lsp_server.backends.base import ModelError
from lsp_server.backends.llama.library import problem as llama_problem
from lsp_server.backends.tiny_gguf import write_tiny_gguf

ROOT = Path(__file__).resolve().parents[2]


def put_blob(store: Path, data: bytes, name: str | None = None) -> tuple[str, int]:
    digest = hashlib.sha256(data).hexdigest()
    (store / "blobs").mkdir(parents=True, exist_ok=True)
    (store / "blobs" / f"sha256-{name or digest}").write_bytes(data)
    return f"sha256:{name or digest}", len(data)


def add_model(store: Path, name: str, tag: str, gguf: bytes, *, namespace: str = "library",
              digest_name: str | None = None) -> Path:
    """One model as `ollama pull` leaves it: config blob, model blob, template blob, manifest."""
    cfg_digest, cfg_size = put_blob(store, json.dumps({"model_format": "gguf", "model_family": "qwen2"}).encode())
    model_digest, model_size = put_blob(store, gguf, digest_name)
    tpl_digest, tpl_size = put_blob(store, b"{{ .Prompt }}")
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": cfg_digest, "size": cfg_size},
        "layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": model_digest, "size": model_size},
            {"mediaType": "application/vnd.ollama.image.template", "digest": tpl_digest, "size": tpl_size},
        ],
    }
    path = store / "manifests" / "registry.ollama.ai" / namespace / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return path


@pytest.fixture(scope="module")
def tiny_bytes(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    return write_tiny_gguf(d / "t.gguf").read_bytes(), write_tiny_gguf(d / "nofim.gguf", fim=False).read_bytes()


@pytest.fixture
def store(tmp_path, monkeypatch, tiny_bytes):
    good, nofim = tiny_bytes
    root = tmp_path / "ollama-models"
    add_model(root, "tiny", "latest", good)
    add_model(root, "tiny", "q8", good)
    add_model(root, "coder", "1b", good, namespace="someone")
    add_model(root, "chat", "latest", nofim)
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    monkeypatch.setenv("DITTO_CACHE_DIR", str(tmp_path / "cache"))
    return root


def test_specs_parse_like_ollama_names():
    assert ollama.parse("ollama:qwen2.5-coder") == ("registry.ollama.ai", "library", "qwen2.5-coder", "latest")
    assert ollama.parse("ollama:qwen2.5-coder:0.5b") == ("registry.ollama.ai", "library", "qwen2.5-coder", "0.5b")
    assert ollama.parse("ollama:me/m:v1") == ("registry.ollama.ai", "me", "m", "v1")
    assert ollama.parse("ollama:hf.co/org/m:q4") == ("hf.co", "org", "m", "q4")
    for bad in ("ollama:", "ollama:a:", "ollama:../x", "ollama:a/b/c/d"):
        with pytest.raises(ModelError):
            ollama.parse(bad)


def test_default_store_is_under_home(monkeypatch):
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    assert ollama.models_dir() == Path.home() / ".ollama" / "models"


def test_resolve_reads_the_blob_in_place_and_checks_its_digest_once(store, monkeypatch):
    blob, name = ollama.resolve("ollama:tiny")
    assert name == "tiny:latest"
    assert blob.parent == store / "blobs" and blob.name.startswith("sha256-")
    assert ollama.resolve("ollama:someone/coder:1b")[1] == "someone/coder:1b"
    # Checked once: the next resolve must not hash the blob again.
    monkeypatch.setattr(ollama, "sha256_of", lambda *a, **k: pytest.fail("hashed twice"))
    assert ollama.resolve("ollama:tiny:latest")[0] == blob


def test_a_damaged_blob_is_refused(store, tiny_bytes, tmp_path):
    good = tiny_bytes[0]
    add_model(store, "broken", "latest", good[:-1] + bytes([good[-1] ^ 1]), digest_name=hashlib.sha256(good).hexdigest())
    with pytest.raises(ModelError, match="damaged.*ollama pull broken:latest"):
        ollama.resolve("ollama:broken")


def test_missing_models_and_blobs_say_what_to_run(store):
    with pytest.raises(ModelError, match="run `ollama pull nothere:latest`"):
        ollama.resolve("ollama:nothere")
    blob, _ = ollama.resolve("ollama:tiny:q8")
    blob.unlink()
    with pytest.raises(ModelError, match="blob .* is missing"):
        ollama.resolve("ollama:tiny:q8")


def test_models_list_shows_the_store(store):
    rows = {r["name"]: r for r in ollama.installed()}
    assert set(rows) == {"ollama:tiny:latest", "ollama:tiny:q8", "ollama:someone/coder:1b", "ollama:chat:latest"}
    assert rows["ollama:tiny:latest"]["gguf"].startswith(str(store / "blobs"))
    out = subprocess.run([sys.executable, "-m", "lsp_server.cli", "models", "list"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ollama:tiny:latest" in out.stdout and "ollama:someone/coder:1b" in out.stdout
    # It says which model to pick where (issue 25): a CPU, a GPU, an Ollama user, and why base models.
    advice = out.stdout.split("Which model:", 1)[1]
    assert all(f"\n  {who} " in advice for who in ("CPU", "GPU", "Ollama")) and "fill-in-the-middle" in advice


needs_llama = pytest.mark.skipif(bool(llama_problem()), reason=f"no llama.cpp library: {llama_problem()}")


@needs_llama
def test_load_runs_the_blob_on_llama_cpp(store):
    from lsp_server.backends.loader import load

    lm = load("ollama:tiny", backend="llama.cpp")
    assert lm.describe()["backend"] == "llama.cpp" and lm.name == "tiny:latest"
    assert lm.path.parent == store / "blobs"  # read where it lies
    assert lm.fim is not None
    assert not list((store.parent / "cache").glob("**/*.gguf"))  # nothing copied


@needs_llama
def test_a_model_without_fim_tokens_is_refused_with_one_line(store):
    from lsp_server.backends.loader import load

    with pytest.raises(ModelError) as e:
        load("ollama:chat", backend="llama.cpp")
    text = str(e.value)
    assert "\n" not in text and "chat:latest has no fill-in-the-middle tokens" in text


@needs_llama
def test_complete_from_the_command_line_on_the_store(store, tmp_path):
    src = tmp_path / "a.py"
    src.write_text("def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    \n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("DITTO_BACKEND", None)  # auto: a GGUF on the CPU runs on llama.cpp
    out = subprocess.run([sys.executable, "-m", "lsp_server.cli", "complete", f"{src}:6:5", "--model", "ollama:tiny",
                          "--max-tokens", "8"], capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "model tiny:latest ready on cpu (F32, llama.cpp)" in out.stderr, out.stderr[-2000:]
    assert "(ollama:tiny, drafter ngram" in out.stderr
