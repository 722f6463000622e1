"""The architecture as rules on imports (docs/design.md, "Import rules"): every import counts,
at module level or inside a function, so a rule cannot be dodged by importing late.

`violations(root)` reads the tree with `ast` (nothing is imported) and returns one line per
broken rule; the real tree must have none, and a copy of it with violations planted must
report each of them, so the checker itself is shown to work.
"""

from __future__ import annotations

import ast
import shutil

import pytest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("lsp_server", "drafters", "ditto_bench")
MAX_LINES = 500  # of a module in lsp_server/, drafters/ or ditto_bench/

# (layer prefix, prefixes it must never import, why)
FORBIDDEN = [
    ("drafters", ("lsp_server", "ditto_bench"), "drafters work on token ids and know nothing of the server"),
    ("lsp_server.numbers", ("lsp_server.", "ditto_bench"), "a leaf"),
    ("lsp_server.lru", ("lsp_server.", "ditto_bench"), "a leaf"),
    ("lsp_server.decoding.types", ("lsp_server.", "ditto_bench", "torch"), "a leaf of plain types"),
    ("lsp_server.decoding", ("lsp_server.completion", "lsp_server.lsp", "lsp_server.settings", "lsp_server.commands",
                             "lsp_server.cli", "lsp_server.backends", "ditto_bench"),
     "the engine knows the backend interface by its methods, nothing above it"),
    ("lsp_server.backends", ("lsp_server.completion", "lsp_server.lsp", "lsp_server.settings", "lsp_server.commands",
                             "lsp_server.cli", "lsp_server.decoding.engine", "ditto_bench"),
     "backends run models; they know nothing of completions, LSP or settings"),
    ("lsp_server.completion", ("lsp_server.lsp", "lsp_server.settings", "lsp_server.commands", "lsp_server.cli",
                               "ditto_bench"), "completions are built the same for the terminal and the server"),
    ("lsp_server.nextedit", ("lsp_server.lsp", "lsp_server.settings", "lsp_server.commands", "lsp_server.cli",
                             "ditto_bench"), "next edits are proposed the same for the benchmark and the server"),
    ("lsp_server.completion", ("lsp_server.nextedit",), "next edits sit beside completions, above them"),
    ("lsp_server.settings", ("lsp_server.lsp", "lsp_server.commands", "lsp_server.cli", "ditto_bench"),
     "settings are read by the CLI before the server exists"),
    ("lsp_server.lsp", ("lsp_server.commands", "lsp_server.cli", "ditto_bench"), "the server runs without the CLI"),
    ("lsp_server.commands", ("ditto_bench",), "only the CLI imports the benchmark tools"),
    ("lsp_server.decoding.probs", ("lsp_server.", "drafters", "ditto_bench"),
     "a leaf (torch only): the draft-model drafter imports it"),
]
# The exceptions to FORBIDDEN, each a leaf: (importer prefix, imported module, why).
ALLOWED = [
    ("lsp_server.backends", "lsp_server.decoding.types", "backends return decoding's plain types"),
    ("drafters.model_drafter", "lsp_server.decoding.probs",
     "the draft model's q must be filtered as the engine filters the target's p, or sampling is not exact"),
]
# External libraries only some layers may import: library -> allowed prefixes.
ONLY_IN = {
    "pygls": ("lsp_server.lsp",),
    "lsprotocol": ("lsp_server.lsp",),
    "transformers": ("lsp_server.backends", "ditto_bench"),
    "llama_cpp": ("lsp_server.backends", "ditto_bench"),  # llama-cpp-python: the optional server in engines.py
    "xllamacpp": ("lsp_server.backends", "ditto_bench"),
    "support": (),  # tests/support: the tests' own engine and helpers
    "tests": (),
}
# Internal prefixes only some modules may import: prefix -> allowed importers.
# lsp_server/cli.py reaches the tools through an entry point (pyproject.toml), never by import.
ONLY_FROM = {"ditto_bench": ("ditto_bench",)}


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(root: Path, path: Path) -> set[str]:
    """Every module `path` imports (absolute names), anywhere in the file; `from P import m`
    counts P.m when P/m is a module of the tree."""
    name = module_name(root, path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            found.add(base)
            for a in node.names:
                sub = root.joinpath(*f"{base}.{a.name}".split("."))
                if sub.with_suffix(".py").is_file() or (sub / "__init__.py").is_file():
                    found.add(f"{base}.{a.name}")
    return {m for m in found if m}


def under(module: str, prefix: str) -> bool:
    return module == prefix.rstrip(".") or module.startswith(prefix if prefix.endswith(".") else prefix + ".")


def violations(root: Path) -> list[str]:
    modules = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            modules[module_name(root, path)] = path
    graph: dict[str, set[str]] = {}
    out: list[str] = []
    for name, path in modules.items():
        deps = imports_of(root, path)
        graph[name] = {d for d in deps if d in modules and d != name}
        for layer, banned, why in FORBIDDEN:
            if not under(name, layer):
                continue
            for d in sorted(deps):
                if any(under(d, b) for b in banned) and \
                        not any(under(name, who) and under(d, what) for who, what, _ in ALLOWED):
                    out.append(f"{name} imports {d}: {why}")
        for d in sorted(deps):
            top = d.split(".")[0]
            if top in ONLY_IN and not any(under(name, p) for p in ONLY_IN[top]):
                out.append(f"{name} imports {d}: only {', '.join(ONLY_IN[top]) or 'tests'} may")
            for prefix, allowed in ONLY_FROM.items():
                if under(d, prefix) and not any(under(name, a) for a in allowed):
                    out.append(f"{name} imports {d}: only {', '.join(allowed)} may")
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES:
            out.append(f"{name} has {lines} lines (at most {MAX_LINES} in lsp_server/, drafters/ and ditto_bench/)")
    out.extend(f"import circle: {' -> '.join(c)}" for c in cycles(graph))
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected group of modules that import each other (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group) + [sorted(group)[0]])

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_tree_keeps_every_import_rule():
    assert violations(ROOT) == []


def test_the_rules_catch_planted_violations(tmp_path):
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    plant = {
        "lsp_server/decoding/engine.py": "\ndef _late():\n    from lsp_server.completion import context  # noqa\n",
        "lsp_server/backends/base.py": "\nimport pygls  # noqa\n",
        "lsp_server/completion/context.py": "\ndef _late():\n    import ditto_bench.storm  # noqa\n",
        "drafters/ngram.py": "\nfrom lsp_server.settings import Settings  # noqa\n",
        "lsp_server/numbers.py": "\nimport lsp_server.lsp.server  # noqa\n",  # numbers -> lsp.server -> ... -> numbers
        "lsp_server/settings.py": "\n" + "# padding\n" * MAX_LINES,
        "ditto_bench/report.py": "\n" + "# padding\n" * MAX_LINES,
        "lsp_server/cli.py": "\ndef _late():\n    import ditto_bench.cli  # noqa\n",
        # The allowed leaf and nothing beside it: the policy is handed to the drafters, never imported.
        "drafters/model_drafter.py": "\nfrom lsp_server.decoding.speculation import Speculation  # noqa\n",
    }
    for rel, text in plant.items():
        with open(tmp_path / rel, "a", encoding="utf-8") as f:
            f.write(text)
    found = "\n".join(violations(tmp_path))
    assert "lsp_server.decoding.engine imports lsp_server.completion.context" in found
    assert "lsp_server.backends.base imports pygls" in found
    assert "lsp_server.completion.context imports ditto_bench.storm" in found
    assert "drafters.ngram imports lsp_server.settings" in found
    assert "import circle:" in found and "lsp_server.numbers" in found.split("import circle:")[1]
    assert "lsp_server.settings has" in found and "ditto_bench.report has" in found
    assert "lsp_server.cli imports ditto_bench.cli: only ditto_bench may" in found
    assert "drafters.model_drafter imports lsp_server.decoding.speculation" in found
    assert "drafters.model_drafter imports lsp_server.decoding.probs" not in found


# -- no module reads another's private state ---------------------------------------------------
# `x._name` (and `getattr(x, "_name")`, `from m import _name`) where `_name` is not a name the
# module itself defines (a function, class, attribute set on self/cls, slot or variable) is a
# reach into another module's private state. The few left are other libraries' and cannot go:
PRIVATE_ALLOWED = {
    # pygls 2.1.1 keeps its workspace, shutdown flag, request futures, server and reply in privates;
    # DittoProtocol (a subclass) fixes what it gets wrong through them and offers public properties
    # (lsp_server/lsp/protocol.py docstring).
    ("lsp_server.lsp.protocol", "_workspace"), ("lsp_server.lsp.protocol", "_shutdown"),
    ("lsp_server.lsp.protocol", "_request_futures"), ("lsp_server.lsp.protocol", "_server"),
    ("lsp_server.lsp.protocol", "_send_response"), ("lsp_server.lsp.protocol", "_execute_handler"),
    ("lsp_server.commands.serve", "_exit"),  # os._exit: leave without finalization (serve.py says why)
    # A subclass uses its base's protected methods and state (drafters/suffix.py extends drafters/ngram.py).
    ("drafters.suffix", "_heal"), ("drafters.suffix", "_ordered_sources"), ("drafters.suffix", "_sources"),
    ("drafters.suffix", "_sync_context"),
    # ctypes has no public name for the types of its pointers and function pointers.
    ("lsp_server.backends.llama.binding", "_Pointer"), ("lsp_server.backends.llama.binding", "_CFuncPtr"),
    # transformers names its attention switch `config._attn_implementation`; it has no public setter.
    ("lsp_server.backends.torch.model", "_attn_implementation"),
    # parso (jedi's parser) has no public hook for its pickle cache's file I/O; lsp_server/completion/
    # definitions.py `parso_cache` wraps its load and save so a truncated pickle is a miss.
    ("lsp_server.completion.definitions", "_load_from_file_system"),
    ("lsp_server.completion.definitions", "_save_to_file_system"),
    ("lsp_server.completion.definitions", "_get_hashed_path"),
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined(tree: ast.AST) -> set[str]:
    """The private names a module defines itself."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            out.add(node.attr)  # set here (on self, or on an object of a class of this module)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets) \
                and isinstance(node.value, (ast.Tuple, ast.List)):
            out.update(e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str))
    return {n for n in out if _private(n)}


def private_reaches(root: Path) -> list[str]:
    found: set[str] = set()
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            mine, name = _defined(tree), module_name(root, path)

            def reach(attr: str, how: str) -> None:
                if _private(attr) and attr not in mine and (name, attr) not in PRIVATE_ALLOWED:
                    found.add(f"{name} reads {how}{attr}")

            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute):
                    reach(node.attr, ".")
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                        and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2 \
                        and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                    reach(node.args[1].value, f"{node.func.id} ")
                elif isinstance(node, ast.ImportFrom):
                    for alias in node.names:
                        reach(alias.name, f"import {node.module}.")
    return sorted(found)


def test_no_module_reads_another_modules_private_state():
    assert private_reaches(ROOT) == []


def test_the_private_check_catches_planted_reaches(tmp_path):
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    plant = {
        "lsp_server/lsp/idle.py": "\ndef _peek(scheduler):\n    return scheduler._idle_running\n",
        "lsp_server/lsp/stats.py": "\ndef _peek2(c):\n    return getattr(c, '_windows', None)\n",
        "drafters/ngram.py": "\nfrom drafters.base import _hidden  # noqa\n",
    }
    for rel, text in plant.items():
        with open(tmp_path / rel, "a", encoding="utf-8") as f:
            f.write(text)
    found = "\n".join(private_reaches(tmp_path))
    assert "lsp_server.lsp.idle reads ._idle_running" in found
    assert "lsp_server.lsp.stats reads getattr _windows" in found
    assert "drafters.ngram reads import drafters.base._hidden" in found


# -- two threads, one owner each (lsp_server/lsp/threads.py) -------------------------------------
# The model worker's side of the server (lsp_server/lsp/worker/) never imports pygls, lsprotocol or a
# module of the event loop's side, and never calls the loop's parts it is handed: it posts them
# (`post(loop_side.warmed, snap)`, `self._post(self._sinks.count, ...)`), so they run on the loop.
WORKER = "lsp_server.lsp.worker"
LOOP_SIDE = tuple(f"lsp_server.lsp.{m}" for m in ("documents", "suggest", "idle", "loading", "nextedit", "handlers",
                                                   "server", "protocol", "errors", "stats", "definitions"))
LOOP_OBJECTS = ("loop_side", "_sinks")  # the names the worker's code holds the loop's parts by


def _loop_object(node: ast.AST) -> str | None:
    """`loop_side` or `self._sinks` (or an attribute of either) as written in a call's function."""
    while isinstance(node, ast.Attribute):
        if node.attr in LOOP_OBJECTS:
            return node.attr
        node = node.value
    return node.id if isinstance(node, ast.Name) and node.id in LOOP_OBJECTS else None


def thread_violations(root: Path) -> list[str]:
    out: list[str] = []
    for path in sorted((root / "lsp_server" / "lsp" / "worker").rglob("*.py")):
        name = module_name(root, path)
        for d in sorted(imports_of(root, path)):
            if d.split(".")[0] in ("pygls", "lsprotocol") or any(under(d, m) for m in LOOP_SIDE):
                out.append(f"{name} imports {d}: the worker's side imports nothing of pygls or of the loop's side")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _loop_object(node.func):
                out.append(f"{name} calls {ast.unparse(node.func)} on the worker: post it to the loop")
    return out


def test_the_worker_side_keeps_the_thread_rule():
    assert thread_violations(ROOT) == []


def test_the_thread_rule_catches_planted_violations(tmp_path):
    shutil.copytree(ROOT / "lsp_server", tmp_path / "lsp_server", ignore=shutil.ignore_patterns("__pycache__"))
    plant = {
        "lsp_server/lsp/worker/idle.py": "\ndef _direct(loop_side, snap):\n    loop_side.warmed(snap)\n",
        "lsp_server/lsp/worker/state.py": "\nimport lsprotocol  # noqa\nfrom lsp_server.lsp.documents import buffer_name  # noqa\n"
                                          "\ndef _count(self):\n    self._sinks.count({})\n",
    }
    for rel, text in plant.items():
        with open(tmp_path / rel, "a", encoding="utf-8") as f:
            f.write(text)
    found = "\n".join(thread_violations(tmp_path))
    assert "lsp_server.lsp.worker.idle calls loop_side.warmed on the worker" in found
    assert "lsp_server.lsp.worker.state calls self._sinks.count on the worker" in found
    assert "lsp_server.lsp.worker.state imports lsprotocol" in found
    assert "lsp_server.lsp.worker.state imports lsp_server.lsp.documents" in found


def test_a_loop_method_called_on_the_worker_raises_with_the_check_on():
    """tests/conftest.py turns the runtime check on (DITTO_CHECK_THREADS=1): a part of the loop's called on
    another thread, or a part of the worker's called on the loop, raises instead of racing."""
    import asyncio
    import threading

    from lsp_server.lsp.idle import IdleWork
    from lsp_server.lsp.threads import WrongThread, checking
    from lsp_server.lsp.worker.state import Worker

    assert checking()
    work = IdleWork(None, None, None, lambda: False, None)
    caught: list[BaseException] = []

    def on_another_thread():
        try:
            work.buffers_changed()
        except BaseException as err:  # noqa: BLE001 (kept for the assertion)
            caught.append(err)

    async def on_the_loop():
        work.buffers_changed()  # fine here
        thread = threading.Thread(target=on_another_thread)
        thread.start()
        thread.join()
        with pytest.raises(WrongThread):
            Worker.sync(object(), None)

    asyncio.run(on_the_loop())
    assert len(caught) == 1 and isinstance(caught[0], WrongThread)
