"""Ditto's ctypes binding of llama.cpp (lsp_server/backends/llama/binding.py): a library of the
wrong build, one that lacks a function, one that does not open (libgomp missing) and a CPU
without AVX2 are refused with one clear line; `--backend auto` then runs on torch and says why
once, `--backend llama.cpp` stops with that line.

The wrong libraries are stand-ins: an object whose attributes are C-callable functions made with
ctypes (no compiler), the *_default_params ones writing the bytes of a given struct image. The
real wheel's library is checked by the same code in the last tests (skipped where it is absent).
"""

from __future__ import annotations

import ctypes
import logging
import platform
from pathlib import Path

import pytest

from lsp_server.backends.base import ModelError
from lsp_server.backends.llama import binding, library as llama_library
from lsp_server.backends.loader import choose_backend, load

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                                reason="the layout check reads returned structs the x86-64 way")

GOOD_CPU = "processor: 0\nflags\t\t: fpu sse sse2 pni ssse3 fma avx f16c avx2 bmi1 bmi2\n"
OLD_CPU = "processor: 0\nflags\t\t: fpu sse sse2 pni ssse3 avx\n"  # Sandy Bridge: AVX, no AVX2/FMA/F16C/BMI2


def default_image(struct, values: dict) -> bytes:
    s = struct()
    for field, value in values.items():
        if value is not None:
            setattr(s, field, value)
    return bytes(s)


GOOD_MODEL = default_image(binding.llama_model_params, binding.MODEL_DEFAULTS[1])
GOOD_CONTEXT = default_image(binding.llama_context_params, binding.CONTEXT_DEFAULTS[1])
# llama-cpp-python 0.3.36's llama.cpp: the same fields without b11549's size_t at byte 112.
OLD_CONTEXT = GOOD_CONTEXT[:112] + GOOD_CONTEXT[120:]


class FakeLibrary:
    """A stand-in for a llama.cpp shared object: every function Ditto binds, as a C function
    pointer; the two *_default_params write `model`/`context` through the hidden return pointer."""

    def __init__(self, model: bytes = GOOD_MODEL, context: bytes = GOOD_CONTEXT, lacks=(), build: int | None = None):
        self._keep = []
        for name in binding.PROTOTYPES:
            if name not in lacks:
                setattr(self, name, self._keep_fn(ctypes.CFUNCTYPE(None)(lambda: None)))
        self.llama_model_default_params = self._writer(model)
        self.llama_context_default_params = self._writer(context)
        if build is not None:
            self.LLAMA_BUILD_NUMBER = build

    def _keep_fn(self, fn):
        self._keep.append(fn)
        return fn

    def _writer(self, image: bytes):
        def write(dst):
            ctypes.memmove(dst, image, len(image))
            return dst

        return self._keep_fn(ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(write))


@pytest.fixture
def own_lib(tmp_path, monkeypatch):
    """DITTO_LLAMA_LIB pointing at a file (its contents are never read: the loader is the fake's)."""
    path = tmp_path / "libllama.so"
    path.write_bytes(b"\x7fELF")
    return {binding.LIB_ENV: str(path)}


def refused(env, fake=None, cpuinfo=GOOD_CPU, loader=None) -> str:
    with pytest.raises(binding.LibraryError) as err:
        binding.open_library(env=env, cpuinfo=cpuinfo, loader=loader or (lambda path: fake))
    text = str(err.value)
    assert text and "\n" not in text
    return text


def test_the_layout_it_was_written_for_is_accepted(own_lib):
    L = binding.open_library(env=own_lib, cpuinfo=GOOD_CPU, loader=lambda path: FakeLibrary(build=binding.BUILD))
    assert L.source == f"{binding.LIB_ENV}={own_lib[binding.LIB_ENV]}"
    assert ctypes.sizeof(binding.llama_context_params) == 168 and ctypes.sizeof(binding.llama_model_params) == 80
    assert callable(L.llama_decode) and callable(L.llama_memory_seq_cp) and callable(L.llama_memory_seq_keep)


def test_another_builds_struct_size_is_refused(own_lib):
    text = refused(own_lib, FakeLibrary(context=OLD_CONTEXT))
    assert "llama_context_default_params writes 160 bytes, b11549's struct has 168" in text
    assert binding.LIB_ENV in text and "--backend torch" in text


def test_a_field_moved_within_the_same_size_is_refused(own_lib):
    shifted = GOOD_MODEL[:16] + GOOD_MODEL[20:24] + GOOD_MODEL[16:20] + GOOD_MODEL[24:]  # n_gpu_layers <-> split_mode
    text = refused(own_lib, FakeLibrary(model=shifted))
    assert "llama_model_default_params gives n_gpu_layers=1 (b11549: -1)" in text


def test_another_build_number_is_refused(own_lib):
    text = refused(own_lib, FakeLibrary(build=11000))
    assert "is llama.cpp build b11000; Ditto's binding is for b11549" in text


def test_a_missing_function_is_refused_by_name(own_lib):
    text = refused(own_lib, FakeLibrary(lacks=("llama_memory_seq_rm",)))
    assert "lacks 1 function(s) Ditto calls (llama_memory_seq_rm)" in text


def test_a_missing_libgomp_is_one_line_that_says_what_to_install(own_lib):
    def no_gomp(path):
        raise OSError("libgomp.so.1: cannot open shared object file: No such file or directory")

    text = refused(own_lib, loader=no_gomp)
    assert "libgomp.so.1" in text and "apt-get install libgomp1" in text and "--backend torch" in text


def test_a_cpu_without_avx2_is_refused_before_the_library_is_opened(monkeypatch, tmp_path):
    path = tmp_path / "xllamacpp.abi3.so"
    monkeypatch.setattr(binding, "locate", lambda env=None: (path, f"{binding.WHEEL} {binding.WHEEL_VERSION}"))

    def must_not_open(p):
        raise AssertionError("opened a library this CPU cannot run")

    text = refused({}, cpuinfo=OLD_CPU, loader=must_not_open)
    assert text.startswith("this CPU lacks AVX2, FMA, F16C, BMI2") and "illegal instruction" in text
    assert binding.cpu_problem(GOOD_CPU) is None and binding.cpu_problem(None) is None  # unknown: trusted
    assert binding.cpu_problem("flags: fpu sse avx avx2 fma f16c").startswith("this CPU lacks BMI2,")


def test_a_library_of_ones_own_build_is_not_held_to_the_wheels_cpu(own_lib):
    L = binding.open_library(env=own_lib, cpuinfo=OLD_CPU, loader=lambda path: FakeLibrary())
    assert L.source.startswith(binding.LIB_ENV)


def test_another_wheel_version_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(binding, "locate", lambda env=None: (tmp_path / "x.so", f"{binding.WHEEL} 2027.1.12000"))
    text = refused({}, FakeLibrary())
    assert "xllamacpp 2027.1.12000 is installed" in text and f"pip install {binding.INSTALL}" in text


def test_auto_says_why_once_and_runs_on_torch_while_llama_cpp_stops_with_that_line(monkeypatch, caplog):
    from lsp_server.backends import loader

    monkeypatch.delenv("DITTO_BACKEND", raising=False)
    monkeypatch.setattr(binding, "_read_cpuinfo", lambda: OLD_CPU)
    monkeypatch.setattr(binding, "locate", lambda env=None: (Path("/nowhere/xllamacpp.abi3.so"),
                                                             f"{binding.WHEEL} {binding.WHEEL_VERSION}"))
    monkeypatch.setattr(llama_library, "_LOADED", [])
    monkeypatch.setattr(loader, "_SAID", set())
    with caplog.at_level(logging.WARNING, logger="lsp_server.backends.loader"):
        assert choose_backend("auto", "default", "cpu") == "torch"
        assert choose_backend("auto", "qwen2.5-coder-1.5b", "cpu") == "torch"
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "this CPU lacks AVX2" in said[0] and "running on torch" in said[0], said
    with pytest.raises(ModelError) as err:
        load("default", backend="llama.cpp")
    assert str(err.value).startswith("this CPU lacks AVX2") and "\n" not in str(err.value)


# -- the real library -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real():
    if binding.wheel_library() is None:
        pytest.skip(f"{binding.INSTALL} is not installed")
    return binding.open_library(env={})


def test_the_wheels_library_passes_every_check(real):
    assert real.source == f"{binding.WHEEL} {binding.WHEEL_VERSION}"
    assert real.path.name == "xllamacpp.abi3.so" and real.path.parent.name == "xllamacpp"
    end, _ = binding._written(binding._address(real.handle, "llama_context_default_params"))
    assert end == 168  # the last field (ctx_other) is written: no padding at the end
    assert b"AVX2 = 1" in real.llama_print_system_info()
    cp = real.llama_context_default_params()
    assert (cp.n_ctx, cp.n_batch, cp.type_k, cp.moe_cache_size, cp.offload_kqv) == (512, 2048, 1, 0, True)


def test_the_sequence_functions_another_engineer_needs_are_bound(real):
    for name in ("llama_memory_seq_rm", "llama_memory_seq_cp", "llama_memory_seq_keep", "llama_memory_seq_add",
                 "llama_memory_seq_pos_max", "llama_state_seq_get_data", "llama_state_seq_set_data"):
        assert callable(getattr(real, name)), name
