"""The definitions of the names the code around the cursor uses, written compactly for the prompt
(docs/design.md, "Definitions and recent edits in the prompt").

A window of 20-30 lines above the cursor often calls what is defined elsewhere: `store.get_items(key)`
says nothing of what `get_items` takes or returns. `resolve` finds, for the names used in the lines
around the cursor (`Request.line` and the AROUND_ABOVE lines above it: calls, attributes, classes,
imported names), where they are defined, in the workspace and in the packages the project sees
(jedi, https://jedi.readthedocs.io: pure Python, static), and writes each as Python comment lines:

    # pkg/store.py: class Store: def get_items(self, key: str) -> list[Item]: ...
    #     \"\"\"Items stored under key.\"\"\"
    # pkg/store.py: class Store(Base): __init__(path: str, limit: int=100), get_items, put, kind
    # pkg/store.py: DEFAULT_LIMIT = 100

a function's header (decorators and body left out), its docstring's first line, a class's line with
its constructor and its public members' names, an attribute's or a constant's line. Nearest use
first; at most MAX_ITEMS items and MAX_CHARS characters (the prompt takes whole lines of it within
its share, lsp_server/completion/extras.py). Left out: builtins and the standard library (the model
knows them), modules, parameters, and what is defined in the lines around the cursor (the prompt
shows them already).

It runs in a process of its own (lsp_server/lsp/definitions.py owns it): jedi can take seconds on a
large project, and in the server's process it would hold the GIL the event loop and the model worker
need. So everything here is a plain value in and out (`Request`, `Resolved`, picklable), and no input
raises: text that does not parse, a binary file, a workspace root that does not exist and jedi
raising anything give an empty result with `error` set. What the loop sends is capped (`cap_text`).

Left out on purpose: processes, timeouts and caching (the loop's), tokens and the budget (extras.py), LSP.
"""

from __future__ import annotations

import glob
import multiprocessing
import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass

AROUND_ABOVE = 30  # lines above the cursor whose names are resolved (a fitted prompt holds 20-30)
AROUND_BELOW = 1  # and below it (the cursor line itself is always in)
MAX_ITEMS = 8  # definitions written at most
MAX_CHARS = 1600  # characters of them at most (~400 tokens: more than a share of the prompt holds)
MAX_LINE = 160  # characters of one written line at most (a longer header is cut)
MAX_MEMBERS = 12  # member names of a class at most
MAX_NAMES = 48  # distinct names looked up at most (each may make jedi read and infer a module)
SOFT_LIMIT_S = 3.0  # no new look-up starts this long after the first (once one item is found): a partial answer
MAX_TEXT = 200_000  # characters of a document sent whole; a longer one is cut (`cap_text`)
HEAD_LINES = 200  # of a cut document: its first lines (the imports) ...
WINDOW_ABOVE, WINDOW_BELOW = 80, 20  # ... and these around the cursor
LONG_LINE = 400  # a line of a cut document longer than this is sent empty (minified code, data)
HEADER_LINES = 8  # lines a function's or a class's header may span
SKIP = frozenset(("self", "cls"))


@dataclass(frozen=True)
class Request:
    """What the loop asks: the definitions used around `line` of `text`, the document at `path` (which
    need not exist on disk) in the workspace at `root` (None or a missing folder: the file's own)."""

    path: str
    text: str  # capped (`cap_text`)
    line: int  # the cursor's line in `text`
    root: str | None = None
    delay_s: float = 0.0  # a test hook: sleep this long first (the `debug_resolve_delay_s` setting)


@dataclass(frozen=True)
class Resolved:
    text: str = ""  # comment lines, each ending with "\n"; "" when nothing was found
    items: int = 0  # definitions written
    names: int = 0  # names looked up
    ms: float = 0.0  # time spent in this process
    error: str | None = None  # what went wrong (the result is then empty or partial)
    partial: bool = False  # cut by SOFT_LIMIT_S (the loop does not cache it: asked again, a warmer process does more)


NICE = 19  # the resolver's priority: the model's passes always come first, a job runs in the CPU they leave


def resolver_nice() -> int:
    """How far the resolver process lowers its priority: NICE, or `DITTO_DEFINITIONS_NICE` where it is set
    (tests/conftest.py sets 0: at 19, beside a busy machine, the process gets about 1% of a core and its
    start alone outlasts any job's time, so the tests of what a job does would test the machine's load)."""
    try:
        return int(os.environ.get("DITTO_DEFINITIONS_NICE", NICE))
    except ValueError:
        return NICE


def start_process() -> None:
    """The resolver process's initializer: lower priority than the model, stdout kept off the protocol
    (a language server's stdout is its JSON-RPC stream; a child inherits it), gone with the server
    (`_gone_with`), jedi and the builtins' stubs read once."""
    try:
        os.nice(resolver_nice())
    except (AttributeError, OSError):
        pass
    try:
        os.dup2(2, 1)
    except OSError:
        pass
    sys.stdout = sys.stderr
    parso_cache()
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_gone_with, args=(parent,), name="ditto-definitions-parent", daemon=True).start()
    import jedi

    try:  # the builtins' stubs read now too: the first job should not pay for them
        jedi.Script("len([])\n").infer(1, 1)
    except Exception:
        pass


_PARSO_PATCHED = False


def parso_cache() -> None:
    """jedi's parse cache made safe to share (idempotent; the resolver process calls it at start, `resolve`
    before each job). parso (jedi's parser) pickles every module it parses into a cache folder, writing
    the file in place and reading back whatever is there: a process killed mid-write (the loop kills a job
    past its time, lsp_server/lsp/definitions.py) or two servers writing one module at once leave a
    truncated pickle, and from then on every job that reads that module (the builtins' stubs: every
    job) raises EOFError, for this server and for the next. So here: the cache is Ditto's own folder
    (DITTO_CACHE_DIR or ~/.cache/ditto, `jedi/`), not the one other jedi tools write without these
    guards; a pickle that cannot be read is a miss, removed and parsed again; and a pickle is written
    to a temporary file first and renamed into place whole. Where parso's internals are not what this
    expects, the cache stays on disk as parso has it (only the folder is Ditto's)."""
    global _PARSO_PATCHED
    if _PARSO_PATCHED:
        return
    _PARSO_PATCHED = True
    import pickle

    import jedi.settings
    from lsp_server.backends.packaged import cache_dir

    jedi.settings.cache_directory = str(cache_dir() / "jedi")
    try:
        import parso.cache as pc

        load, hashed = pc._load_from_file_system, pc._get_hashed_path
    except (ImportError, AttributeError):
        return

    def safe_load(hashed_grammar, path, p_time, cache_path=None):
        try:
            return load(hashed_grammar, path, p_time, cache_path=cache_path)
        except (EOFError, pickle.UnpicklingError, AttributeError, ImportError, IndexError, TypeError,
                ValueError, MemoryError, OSError):
            try:
                os.remove(hashed(hashed_grammar, path, cache_path=cache_path))
            except OSError:
                pass
            return None

    def safe_save(hashed_grammar, path, item, cache_path=None):
        target = hashed(hashed_grammar, path, cache_path=cache_path)
        temp = f"{target}.{os.getpid()}.tmp"
        try:
            with open(temp, "wb") as f:
                pickle.dump(item, f, pickle.HIGHEST_PROTOCOL)
            os.replace(temp, target)
        except OSError:  # (a full disk, a read-only folder: the module stays cached in memory)
            try:
                os.remove(temp)
            except OSError:
                pass

    pc._load_from_file_system, pc._save_to_file_system = safe_load, safe_save


def _gone_with(parent) -> None:
    """Leave when the server's process ends, however it ends. A pool's process waits for its next job
    on a queue whose write end it holds itself, so it outlives a server killed or left by os._exit,
    and it holds multiprocessing's resource tracker (a process that inherited the server's stdout)
    alive with it: the client would never see the protocol's stream end."""
    parent.join()  # (returns once the server's end of the sentinel pipe closes)
    os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))  # (no cleanup to run: nothing is kept)


def process_id() -> int:
    """The resolver process's id (the loop kills a process whose job ran too long)."""
    return os.getpid()


def cap_text(text: str, starts, line: int, limit: int = MAX_TEXT) -> tuple[str, int]:
    """(the text to send, the cursor's line in it): `text` itself up to `limit` characters, else its
    first HEAD_LINES lines and the lines around `line`, lines over LONG_LINE characters sent empty.
    `starts[i]` is where line i starts (the session's line table), so a huge text is never split."""
    if len(text) <= limit:
        return text, line
    n = len(starts)

    def line_at(i: int) -> str:
        a = int(starts[i])
        b = int(starts[i + 1]) - 1 if i + 1 < n else len(text)
        return text[a:b] if b - a <= LONG_LINE else ""

    head = min(HEAD_LINES, n)
    lo, hi = max(head, line - WINDOW_ABOVE), min(n, line + WINDOW_BELOW + 1)
    kept = [line_at(i) for i in range(head)] + [line_at(i) for i in range(lo, hi)]
    return "\n".join(kept), head + line - lo if line >= lo else min(line, head - 1)


def resolve(request: Request) -> Resolved:
    """The definitions used around the cursor (module docstring); never raises."""
    t0 = time.perf_counter()
    if request.delay_s > 0:
        time.sleep(request.delay_s)
    try:
        lines, names, error, partial = _resolve(request)
    except Exception as err:  # jedi on any input: an empty answer, never an error
        lines, names, error, partial = [], 0, f"{type(err).__name__}: {err}", False
    text = "".join(part + "\n" for item in lines for part in item)
    return Resolved(text, len(lines), names, round((time.perf_counter() - t0) * 1000, 1), error, partial)


def _resolve(request: Request) -> tuple[list[list[str]], int, str | None, bool]:
    text = request.text
    if "\x00" in text:
        return [], 0, "binary", False
    parso_cache()
    import jedi

    root = request.root if request.root and os.path.isdir(request.root) else None
    folder = root or os.path.dirname(request.path)
    project = jedi.Project(folder, added_sys_path=_venv_paths(root)) if folder and os.path.isdir(folder) else None
    script = jedi.Script(code=text, path=request.path, project=project)
    lo, hi = max(0, request.line - AROUND_ABOVE), request.line + AROUND_BELOW  # 0-based, inclusive
    used = [n for n in script.get_names(all_scopes=True, definitions=False, references=True)
            if lo <= n.line - 1 <= hi and n.name not in SKIP]
    used.sort(key=lambda n: (abs(request.line - (n.line - 1)) + (n.line - 1 > request.line), n.column))
    out: list[list[str]] = []
    seen_names: set[str] = set()
    seen_defs: set[tuple] = set()
    chars, looked, error, partial = 0, 0, None, False
    started = time.perf_counter()  # (a cold process or a busy machine may have spent seconds before this)
    for name in used:
        if name.name in seen_names:
            continue
        if len(out) >= MAX_ITEMS or looked >= MAX_NAMES:
            break
        if out and time.perf_counter() - started > SOFT_LIMIT_S:
            partial = True
            break
        seen_names.add(name.name)
        looked += 1
        try:
            found = name.goto(follow_imports=True)
        except Exception as err:  # one name jedi cannot follow: the others still count
            error = f"{type(err).__name__}: {err}"
            continue
        for d in found[:1]:
            key = (str(d.module_path), d.line, d.name)
            if key in seen_defs or not _wanted(d, request.path, root, lo, hi):
                continue
            seen_defs.add(key)
            try:
                item = _written(d, _where(d, request.path, root))
            except Exception as err:
                error = f"{type(err).__name__}: {err}"
                continue
            size = sum(len(part) + 1 for part in item)
            if item and item not in out and chars + size <= MAX_CHARS:  # (two names of one statement: once)
                out.append(item)
                chars += size
    return out, looked, error, partial


def _venv_paths(root: str | None) -> list[str]:
    """The site-packages of the workspace's own virtual environment, found without running its Python."""
    if root is None:
        return []
    found = []
    for venv in (".venv", "venv", "env"):
        found += sorted(glob.glob(os.path.join(root, venv, "lib", "python3*", "site-packages")))
        found += sorted(glob.glob(os.path.join(root, venv, "Lib", "site-packages")))
    return found


def _inside(path: str | None, folder: str | None) -> bool:
    if not path or not folder:
        return False
    try:
        return os.path.commonpath([os.path.abspath(path), os.path.abspath(folder)]) == os.path.abspath(folder)
    except ValueError:  # other drives
        return False


def _wanted(d, path: str, root: str | None, lo: int, hi: int) -> bool:
    """Whether definition `d` is worth a line: not a module, a parameter, a builtin or the standard
    library's, nor in the lines around the cursor."""
    if d.type in ("module", "param", "keyword", "namespace") or d.module_path is None or d.line is None:
        return False
    here = os.path.abspath(str(d.module_path)) == os.path.abspath(path)
    if here:
        return not lo <= d.line - 1 <= hi
    if d.in_builtin_module():
        return False
    top = (d.module_name or "").partition(".")[0]
    return _inside(str(d.module_path), root) or top not in getattr(sys, "stdlib_module_names", ())


def _where(d, path: str, root: str | None) -> str:
    """The definition's place as the prompt names it: its path in the workspace, else its module."""
    module = str(d.module_path)
    if root is not None and _inside(module, root):
        return os.path.relpath(module, root).replace(os.sep, "/")
    if os.path.abspath(module) == os.path.abspath(path):
        return os.path.basename(path)
    return d.module_name or os.path.basename(module)


_SPACE = re.compile(r"\s+")


def _header(code: str, stop: bool = True) -> str:
    """The first logical line of `code` up to its `:` (a `def` or `class` header over several lines
    joined), comments left out, whitespace collapsed; "" when it does not end within the code given.
    `stop` False: the whole of `code` so (a statement's line without its comment)."""
    depth, out, quote, i = 0, [], None, 0
    while i < len(code):
        ch = code[i]
        if quote is not None:
            out.append(code[i : i + 2] if ch == "\\" else ch)
            i += 2 if ch == "\\" else 1
            quote = None if ch == quote else quote
            continue
        if ch == "#":  # to the end of its line
            end = code.find("\n", i)
            i = len(code) if end < 0 else end
            continue
        if ch == ":" and depth == 0 and stop:
            return _tidy("".join(out))
        depth += (ch in "([{") - (ch in ")]}")
        quote = ch if ch in "'\"" else None
        out.append(ch)
        i += 1
    return "" if stop else _tidy("".join(out))


def _tidy(code: str) -> str:
    return _SPACE.sub(" ", code).replace("( ", "(").replace(" )", ")").replace(", )", ")").strip()


def _doc_line(d) -> str | None:
    doc = (d.docstring(raw=True) or "").strip()
    first = doc.split("\n", 1)[0].strip()
    return f'#     """{_cut(first, MAX_LINE - 12)}"""' if first else None


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _class_of(d):
    """The class `d` is defined in (a method, an attribute set in a method), or None."""
    p = d.parent()
    for _ in range(2):
        if p is None or p.type == "module":
            return None
        if p.type == "class":
            return p
        p = p.parent()
    return None


def _written(d, where: str) -> list[str]:
    """The comment lines of one definition (module docstring), [] when it cannot be written."""
    owner = _class_of(d)
    inside = f"class {owner.name}: " if owner is not None else ""
    if d.type in ("function", "property"):
        head = _header(d.get_line_code(after=HEADER_LINES))
        if not head:
            return []
        doc = _doc_line(d)
        return [_cut(f"# {where}: {inside}{head}: ...", MAX_LINE)] + ([doc] if doc else [])
    if d.type == "class":
        head = _header(d.get_line_code(after=HEADER_LINES))
        if not head:
            return []
        members = [m.name for m in d.defined_names() if not m.name.startswith("_")][:MAX_MEMBERS]
        sigs = d.get_signatures()
        init = sigs[0].to_string() if sigs else ""
        init = init[init.index("("):] if "(" in init else ""
        listed = ", ".join(([f"__init__{init}"] if init and init != "()" else []) + members)
        doc = _doc_line(d)
        return [_cut(f"# {where}: {head}: {listed}" if listed else f"# {where}: {head}: ...", MAX_LINE)] + \
            ([doc] if doc else [])
    if d.type == "statement":
        code = _header(d.get_line_code(), stop=False)
        if not code or code.startswith(("for ", "with ", "import ", "from ", "except")) or len(code) > 4 * MAX_LINE:
            return []
        return [_cut(f"# {where}: {inside}{code}", MAX_LINE)]
    return []
