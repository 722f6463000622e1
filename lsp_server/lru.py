"""Get-or-make in a bounded mapping, the least recently used entry dropped past the bound (a leaf:
the Completer's per-file states by key, lsp_server/completion/files.py, and the edit histories by
document, lsp_server/nextedit/history.py)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, TypeVar

V = TypeVar("V")


def lru_get(entries: OrderedDict, key, make: Callable[[], V], bound: int) -> V:
    """The entry of `key` (made on first use), now the most recently used; entries past `bound` go."""
    value = entries.pop(key, None)
    if value is None:
        value = make()
    entries[key] = value
    while len(entries) > bound:
        entries.popitem(last=False)
    return value
