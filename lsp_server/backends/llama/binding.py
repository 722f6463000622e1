"""Ditto's own ctypes binding of llama.cpp's C API: the structs and prototypes of the functions the
llama.cpp backend calls, bound on one library object (`Library`), for the one build Ditto pins.

Which build: llama.cpp b11549, as the prebuilt wheel `xllamacpp==2026.10.11549` carries it
(one shared object, `xllamacpp/xllamacpp.abi3.so`, manylinux2014 x86-64; AVX2, FMA, F16C, BMI2,
OpenMP; found through the installed package, never a site-packages path). No compiler runs.

Where the layouts come from. The wheel's `llama.h` is not shipped with it, and b11549's git tag
could not be brought here (ggml-org/llama.cpp is larger than the fetch limit), so the structs
were taken from the newest llama.h at hand, llama-cpp-python 0.3.36's vendored copy
(`vendor/llama.cpp/include/llama.h`, the same functions and the same `llama_model_params`),
and checked field by field against the wheel's own machine code and debug information:
`llama_context_default_params` writes 168 bytes where that header declares 160, and
b11549's `common_context_params_to_llama` (disassembled) stores `common_params::moe_cache_size`
(a size_t, DWARF offset 4048) at byte 112, after `type_k`/`type_v`; every other store it makes
lands where the 0.3.36 header says. `llama_model_default_params` writes the 0.3.36 layout
(80 bytes). The prototypes are the 0.3.36 header's; each bound function is exported by the
wheel (252 `llama_*` symbols). `check_layout` re-does that comparison at every load.

Also here: the checks at load that turn a wrong library into one clear error instead of a
crash (`open_library`): the CPU's flags (the wheel's code needs AVX2 and would die with SIGILL),
the library opening at all (libgomp.so.1 missing), every symbol present, the build number where
the library exports one, and the default-params sizes and values. A library of one's own build
(`DITTO_LLAMA_LIB`, docs/backends.md) gets the same checks except the CPU's.

Left out on purpose: the high-level model (lsp_server/backends/llama/model.py), llama.cpp's
log routing and the AMX check (library.py), and every function Ditto does not call.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import platform
from ctypes import POINTER, c_bool, c_char_p, c_float, c_int, c_int8, c_int32, c_size_t, c_uint8, c_uint32, c_void_p
from pathlib import Path

from lsp_server.backends.base import ModelError
from lsp_server.backends.llama.options import LlamaOptions

BUILD = 11549  # llama.cpp's build number
WHEEL = "xllamacpp"
WHEEL_VERSION = "2026.10.11549"
INSTALL = f"{WHEEL}=={WHEEL_VERSION}"
LIB_ENV = "DITTO_LLAMA_LIB"  # a llama.cpp library of one's own build (libllama.so of b11549): options.py
CPU_FLAGS = ("avx", "avx2", "fma", "f16c", "bmi2")  # what the wheel's code is compiled for (/proc/cpuinfo names)

LLAMA_FLASH_ATTN_TYPE_AUTO, LLAMA_FLASH_ATTN_TYPE_DISABLED, LLAMA_FLASH_ATTN_TYPE_ENABLED = -1, 0, 1
GGML_TYPE_F16 = 1

llama_log_callback = ctypes.CFUNCTYPE(None, c_int, c_char_p, c_void_p)  # ggml_log_callback
llama_progress_callback = ctypes.CFUNCTYPE(c_bool, c_float, c_void_p)
ggml_abort_callback = ctypes.CFUNCTYPE(c_bool, c_void_p)


class llama_model_params(ctypes.Structure):
    _fields_ = [
        ("devices", c_void_p),
        ("tensor_buft_overrides", c_void_p),
        ("n_gpu_layers", c_int32),
        ("split_mode", c_int),  # enum llama_split_mode
        ("load_mode", c_int),  # enum llama_load_mode
        ("lazy_mode", c_int),  # enum llama_lazy_mode
        ("main_gpu", c_int32),
        ("tensor_split", POINTER(c_float)),
        ("progress_callback", llama_progress_callback),
        ("progress_callback_user_data", c_void_p),
        ("kv_overrides", c_void_p),
        ("vocab_only", c_bool),
        ("check_tensors", c_bool),
        ("use_extra_bufts", c_bool),
        ("no_host", c_bool),
        ("no_alloc", c_bool),
        ("load_mtp", c_bool),
    ]


class llama_context_params(ctypes.Structure):
    _fields_ = [
        ("n_ctx", c_uint32),
        ("n_batch", c_uint32),
        ("n_ubatch", c_uint32),
        ("n_seq_max", c_uint32),
        ("n_rs_seq", c_uint32),
        ("n_outputs_max", c_uint32),
        ("n_outputs_max_per_seq", c_uint32),
        ("n_threads", c_int32),
        ("n_threads_batch", c_int32),
        ("ctx_type", c_int),
        ("rope_scaling_type", c_int),
        ("pooling_type", c_int),
        ("attention_type", c_int),
        ("flash_attn_type", c_int),
        ("rope_freq_base", c_float),
        ("rope_freq_scale", c_float),
        ("yarn_ext_factor", c_float),
        ("yarn_attn_factor", c_float),
        ("yarn_beta_fast", c_float),
        ("yarn_beta_slow", c_float),
        ("yarn_orig_ctx", c_uint32),
        ("defrag_thold", c_float),
        ("cb_eval", c_void_p),
        ("cb_eval_user_data", c_void_p),
        ("type_k", c_int),  # enum ggml_type
        ("type_v", c_int),
        ("moe_cache_size", c_size_t),  # b11549 only (module docstring); 0 = off
        ("abort_callback", ggml_abort_callback),
        ("abort_callback_data", c_void_p),
        ("embeddings", c_bool),
        ("offload_kqv", c_bool),
        ("no_perf", c_bool),
        ("op_offload", c_bool),
        ("swa_full", c_bool),
        ("kv_unified", c_bool),
        ("samplers", c_void_p),
        ("n_samplers", c_size_t),
        ("ctx_other", c_void_p),
    ]


class llama_batch(ctypes.Structure):
    _fields_ = [
        ("n_tokens", c_int32),
        ("token", POINTER(c_int32)),
        ("embd", POINTER(c_float)),
        ("pos", POINTER(c_int32)),
        ("n_seq_id", POINTER(c_int32)),
        ("seq_id", POINTER(POINTER(c_int32))),
        ("logits", POINTER(c_int8)),
    ]


# What b11549's *_default_params write: (size, {field: value}) checked by check_layout. A field
# moved, added or removed shifts these values or the size.
MODEL_DEFAULTS = (80, {"n_gpu_layers": -1, "split_mode": 1, "main_gpu": 0, "tensor_split": None, "kv_overrides": None,
                       "vocab_only": False, "check_tensors": False, "use_extra_bufts": True, "no_host": False,
                       "no_alloc": False, "load_mtp": False})
CONTEXT_DEFAULTS = (168, {"n_ctx": 512, "n_batch": 2048, "n_ubatch": 512, "n_seq_max": 1, "n_rs_seq": 0,
                          "n_outputs_max": 0, "flash_attn_type": LLAMA_FLASH_ATTN_TYPE_AUTO, "yarn_orig_ctx": 0,
                          "cb_eval": None, "type_k": GGML_TYPE_F16, "type_v": GGML_TYPE_F16, "moe_cache_size": 0,
                          "abort_callback_data": None, "embeddings": False, "offload_kqv": True, "no_perf": True,
                          "op_offload": True, "swa_full": True, "kv_unified": False, "samplers": None,
                          "n_samplers": 0, "ctx_other": None})

_P = c_void_p  # llama_model *, llama_context *, llama_vocab *, llama_memory_t: opaque
_I = c_int32
# name: (restype, argtypes), as b11549's llama.h declares them (module docstring).
PROTOTYPES = {
    "llama_backend_init": (None, []),
    "llama_log_set": (None, [llama_log_callback, c_void_p]),
    "llama_print_system_info": (c_char_p, []),
    "llama_supports_gpu_offload": (c_bool, []),
    "llama_model_default_params": (llama_model_params, []),
    "llama_context_default_params": (llama_context_params, []),
    "llama_model_load_from_file": (_P, [c_char_p, llama_model_params]),
    "llama_model_free": (None, [_P]),
    "llama_init_from_model": (_P, [_P, llama_context_params]),
    "llama_free": (None, [_P]),
    "llama_model_get_vocab": (_P, [_P]),
    "llama_model_n_ctx_train": (_I, [_P]),
    "llama_model_meta_val_str": (_I, [_P, c_char_p, c_char_p, c_size_t]),
    "llama_n_ctx_seq": (c_uint32, [_P]),
    "llama_get_memory": (_P, [_P]),
    "llama_batch_init": (llama_batch, [_I, _I, _I]),
    "llama_batch_free": (None, [llama_batch]),
    "llama_decode": (_I, [_P, llama_batch]),
    "llama_get_logits_ith": (POINTER(c_float), [_P, _I]),
    # the memory of a context: seq_id, then positions [p0, p1) (-1: to the end)
    "llama_memory_seq_rm": (c_bool, [_P, _I, _I, _I]),
    "llama_memory_seq_cp": (None, [_P, _I, _I, _I, _I]),  # src, dst, p0, p1
    "llama_memory_seq_keep": (None, [_P, _I]),
    "llama_memory_seq_add": (None, [_P, _I, _I, _I, _I]),  # seq, p0, p1, delta
    "llama_memory_seq_pos_max": (_I, [_P, _I]),
    "llama_state_seq_get_size": (c_size_t, [_P, _I]),
    "llama_state_seq_get_data": (c_size_t, [_P, POINTER(c_uint8), c_size_t, _I]),
    "llama_state_seq_set_data": (c_size_t, [_P, POINTER(c_uint8), c_size_t, _I]),
    "llama_vocab_n_tokens": (_I, [_P]),
    "llama_vocab_bos": (_I, [_P]),
    "llama_vocab_eos": (_I, [_P]),
    "llama_vocab_eot": (_I, [_P]),
    "llama_vocab_pad": (_I, [_P]),
    "llama_vocab_get_add_bos": (c_bool, [_P]),
    "llama_vocab_get_text": (c_char_p, [_P, _I]),
    "llama_vocab_is_control": (c_bool, [_P, _I]),
    "llama_vocab_is_eog": (c_bool, [_P, _I]),
    "llama_tokenize": (_I, [_P, c_char_p, _I, POINTER(c_int32), _I, c_bool, c_bool]),
    "llama_detokenize": (_I, [_P, POINTER(c_int32), _I, c_char_p, _I, c_bool, c_bool]),
    "llama_token_to_piece": (_I, [_P, _I, c_char_p, _I, _I, c_bool]),
}


class LibraryError(ModelError):
    """The llama.cpp library cannot be used here; the message says why and what to do (one line)."""


class Library:
    """One loaded llama.cpp library: every function of PROTOTYPES as an attribute, with its types
    set (`L.llama_decode(ctx, batch)`), plus the structs and constants above. `path` and `source`
    say which library it is (the wheel, or DITTO_LLAMA_LIB)."""

    llama_log_callback = llama_log_callback
    llama_model_params = llama_model_params
    llama_context_params = llama_context_params
    llama_batch = llama_batch
    LLAMA_FLASH_ATTN_TYPE_AUTO = LLAMA_FLASH_ATTN_TYPE_AUTO
    LLAMA_FLASH_ATTN_TYPE_DISABLED = LLAMA_FLASH_ATTN_TYPE_DISABLED
    LLAMA_FLASH_ATTN_TYPE_ENABLED = LLAMA_FLASH_ATTN_TYPE_ENABLED

    def __init__(self, handle, path: Path, source: str):
        self.handle, self.path, self.source = handle, Path(path), source
        missing = []
        for name, (restype, argtypes) in PROTOTYPES.items():
            address = _address(handle, name)
            if address is None:
                missing.append(name)
                continue
            setattr(self, name, ctypes.CFUNCTYPE(restype, *argtypes)(address))
        if missing:
            raise LibraryError(f"{source} lacks {len(missing)} function(s) Ditto calls ({', '.join(missing[:4])}"
                               f"{', ...' if len(missing) > 4 else ''}): it is not llama.cpp b{BUILD}; {_FIX}")

    def symbol(self, name: str):
        """A ctypes function of the library that PROTOTYPES does not bind, or None (e.g. ggml_cpu_has_amx_int8)."""
        address = _address(self.handle, name)
        return None if address is None else ctypes.CFUNCTYPE(c_int)(address)


_FIX = (f"reinstall the pinned wheel (pip install {INSTALL}), or point {LIB_ENV} at a libllama.so built from "
        f"llama.cpp's tag b{BUILD}, or use --backend torch")


def _address(handle, name: str) -> int | None:
    try:
        fn = getattr(handle, name)
    except AttributeError:
        return None
    return ctypes.cast(fn, c_void_p).value


def _exported_int(handle, name: str) -> int | None:
    """An `int` variable the library exports (LLAMA_BUILD_NUMBER), or None. A stand-in library in
    the tests is no CDLL and gives a plain int attribute."""
    if isinstance(handle, ctypes.CDLL):
        try:
            return c_int.in_dll(handle, name).value
        except ValueError:
            return None
    value = getattr(handle, name, None)
    return value if isinstance(value, int) else None


# -- finding the library ----------------------------------------------------------------------------


def wheel_library() -> Path | None:
    """The xllamacpp wheel's shared object, found through the installed package (not imported)."""
    spec = importlib.util.find_spec(WHEEL)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    exact = folder / "xllamacpp.abi3.so"
    return exact if exact.is_file() else next(iter(sorted(folder.glob("xllamacpp*.so"))), None)


def locate(env=None) -> tuple[Path | None, str]:
    """(path, source) of the library to load: DITTO_LLAMA_LIB if set, else the wheel's."""
    own = LlamaOptions.from_env(env).library
    if own:
        return Path(own).expanduser(), f"{LIB_ENV}={own}"
    path = wheel_library()
    if path is None:
        return None, WHEEL
    try:
        version = importlib.metadata.version(WHEEL)
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    return path, f"{WHEEL} {version}"


# -- the checks -------------------------------------------------------------------------------------


def cpu_problem(cpuinfo: str | None) -> str | None:
    """Why the wheel's code cannot run on this CPU (the flags of /proc/cpuinfo's text), or None.

    None also when the text is unknown (no /proc/cpuinfo): the library is then loaded and trusted."""
    if not cpuinfo:
        return None
    line = next((l for l in cpuinfo.splitlines() if l.split(":")[0].strip() in ("flags", "Features")), None)
    if line is None:
        return None
    flags = set(line.split(":", 1)[1].split())
    lacks = [f for f in CPU_FLAGS if f not in flags]
    if not lacks:
        return None
    return (f"this CPU lacks {', '.join(f.upper() for f in lacks)}, which the prebuilt llama.cpp library ({INSTALL}) "
            f"needs (it would stop with an illegal instruction): use --backend torch, or build llama.cpp b{BUILD} "
            f"for this CPU and set {LIB_ENV} to its libllama.so (docs/backends.md)")


def _read_cpuinfo() -> str | None:
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return None


def open_problem(err: OSError, path: Path, source: str) -> str:
    """The one-line message for a library that does not open (dlopen's error)."""
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    if "libgomp" in text:
        return (f"llama.cpp's library needs the system's OpenMP runtime, libgomp.so.1, which is missing: install it "
                f"(Debian/Ubuntu: apt-get install libgomp1; Fedora/RHEL: dnf install libgomp), or use --backend torch")
    if "GLIBC" in text or "GLIBCXX" in text:
        return (f"{source}'s library needs a newer C/C++ runtime than this system has ({text}): the prebuilt one needs "
                f"glibc 2.17+ and libstdc++ of GCC 10+; use --backend torch, or build llama.cpp yourself ({LIB_ENV})")
    return f"cannot open llama.cpp's library {path} ({text}): {_FIX}"


def _written(fn_address: int, size: int = 1024) -> tuple[int, bytes]:
    """(bytes written, the bytes) by a `struct X f(void)` that returns through a hidden pointer.

    x86-64 System V passes the address of a returned struct larger than 16 bytes in rdi (the
    first integer argument), so the function is called with a buffer filled twice with a
    different pattern; the written span ends at the last byte that took the function's value
    both times. Trailing padding is not written, so callers round the span up to 8."""
    proto = ctypes.CFUNCTYPE(c_void_p, c_void_p)(fn_address)
    images = []
    for fill in (0xA5, 0x5A):
        buf = (c_uint8 * size)(*([fill] * size))
        proto(ctypes.addressof(buf))
        images.append(bytes(buf))
    a, b = images
    end = max((i + 1 for i in range(size) if a[i] == b[i]), default=0)
    return end, a


def check_layout(L: Library) -> None:
    """LibraryError unless the *_default_params functions write the sizes and values of b11549's
    structs (MODEL_DEFAULTS, CONTEXT_DEFAULTS): a library of another build would be handed
    structs of the wrong shape and misread every field after the first difference."""
    problems = []
    for name, struct, (size, want) in (("llama_model_default_params", llama_model_params, MODEL_DEFAULTS),
                                       ("llama_context_default_params", llama_context_params, CONTEXT_DEFAULTS)):
        assert ctypes.sizeof(struct) == size, (struct, ctypes.sizeof(struct))
        address = _address(L.handle, name)
        if platform.machine().lower() in ("x86_64", "amd64"):
            end, image = _written(address)
            if (end + 7) // 8 * 8 != size:
                problems.append(f"{name} writes {end} bytes, b{BUILD}'s struct has {size}")
                continue
            got = struct.from_buffer_copy(image[:size])
        else:  # no hidden-pointer trick on this ABI: the values alone
            got = getattr(L, name)()
        wrong = [(field, _value(getattr(got, field)), value) for field, value in want.items()
                 if _value(getattr(got, field)) != value]
        if wrong:
            problems.append(f"{name} gives " + ", ".join(f"{f}={g!r} (b{BUILD}: {w!r})" for f, g, w in wrong[:3]))
    if problems:
        raise LibraryError(f"{L.source} is not the llama.cpp build Ditto's binding was written for: "
                           f"{'; '.join(problems)}; {_FIX}")


def _value(v):
    """A field's value as check_layout compares it: pointers and callbacks as None when null."""
    if isinstance(v, ctypes._Pointer) or isinstance(v, ctypes._CFuncPtr):
        return None if not v else "set"
    return v


def check_build(L: Library) -> None:
    """LibraryError if the library exports a build number other than b11549's (the wheel exports
    LLAMA_BUILD_NUMBER as 0, built without git: then the pinned wheel version says which build)."""
    number = _exported_int(L.handle, "LLAMA_BUILD_NUMBER")
    if number and number != BUILD:
        raise LibraryError(f"{L.source} is llama.cpp build b{number}; Ditto's binding is for b{BUILD}: {_FIX}")
    if L.source.startswith(WHEEL + " ") and L.source != f"{WHEEL} {WHEEL_VERSION}":
        raise LibraryError(f"{L.source} is installed; Ditto's binding is for {INSTALL} (llama.cpp b{BUILD}): "
                           f"run `pip install {INSTALL}`, or use --backend torch")


def open_library(env=None, cpuinfo: str | None | bool = True, loader=ctypes.CDLL) -> Library:
    """Find, check and bind the llama.cpp library (module docstring); LibraryError says why not.

    `cpuinfo`: /proc/cpuinfo's text (True: read it); `loader`: opens a path (ctypes.CDLL). Both
    are parameters so that the tests can show each refusal without such a machine."""
    path, source = locate(env)
    if path is None:
        raise LibraryError(f"the llama.cpp backend needs the prebuilt llama.cpp wheel: run `pip install {INSTALL}` "
                           f"(seconds, nothing is compiled), or set {LIB_ENV}, or use --backend torch")
    own = source.startswith(LIB_ENV)
    if not own:
        problem = cpu_problem(_read_cpuinfo() if cpuinfo is True else cpuinfo)
        if problem:
            raise LibraryError(problem)
    elif not path.is_file():
        raise LibraryError(f"{LIB_ENV} names {path}, which is no file: give the path of libllama.so, or unset it")
    try:
        handle = loader(str(path))
    except OSError as err:
        raise LibraryError(open_problem(err, path, source)) from None
    L = Library(handle, path, source)
    check_build(L)
    check_layout(L)
    L.llama_backend_init()
    return L
