"""A small workspace's module with a class and functions (`STORE`, written by `write_store`): what the
tests of the prompt's definitions resolve (lsp_server/completion/definitions.py, its loop side)."""

from __future__ import annotations

import textwrap
from pathlib import Path

STORE = textwrap.dedent('''\
    class Store:
        def get_items(self, key: str) -> list:
            """Items stored under key."""
            return []


    def open_store(path: str) -> Store:
        """Open the store at path."""
        return Store()
    ''')


def write_store(root: Path) -> Path:
    path = root / "store.py"
    path.write_text(STORE)
    return path



def slow_start(seconds: float) -> None:
    """The definitions resolver's process start (lsp_server/completion/definitions.py `start_process`),
    `seconds` slower: `DefinitionJobs.initializer = functools.partial(slow_start, s)` (a spawned process
    imports it from here)."""
    import time

    from lsp_server.completion.definitions import start_process

    time.sleep(seconds)
    start_process()
