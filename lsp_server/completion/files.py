"""What one file keeps between completions: its prompt window and its place (`FileState`).

The server's model worker owns one `FileState` per open document (lsp_server/lsp/worker/state.py)
and hands it to every Completer call for that document, so that per-file state lives with the
document and goes with it when it closes. Callers without a document session (the command
line, the benchmark, tests) name files by key instead, and the Completer keeps their states in
its own `FileStates` (least recently used dropped past a bound).

- `window`: where the lines-above window starts, the place's middle and last line
  (lsp_server/completion/context.py `Window`);
- `place`: the last generation answered there, for type-through and its continuation
  (lsp_server/completion/place.py `Place`);
- `prefix`: the file's prefix sequence and its KV, filled while idle (lsp_server/completion/wholefile.py
  `FilePrefix`): requests copy the whole file above their place from it. It goes with the file.

Left out on purpose: the KV of the file's last prompt (the engine keeps it per key,
lsp_server/decoding/engine.py), LSP, threads (a FileState is used on the model worker only).
"""

from __future__ import annotations

from collections import OrderedDict

from lsp_server.completion.context import Window
from lsp_server.completion.place import Place
from lsp_server.lru import lru_get
from lsp_server.completion.wholefile import FilePrefix


class FileState:
    __slots__ = ("window", "place", "prefix")

    def __init__(self):
        self.window = Window()
        self.place: Place | None = None
        self.prefix = FilePrefix()

    def shift(self, lines: int) -> None:
        """The text the Completer is given starts `lines` lines later (or earlier, negative) than it
        did: the server's snapshot window of a long document moved (lsp_server/lsp/documents.py).
        The prompt window and the place move with it, so a prompt is the one the whole text gives."""
        w = self.window
        if lines:
            self.prefix.shift(lines)
        if lines == 0 or w.start is None:
            return
        start = w.start - lines
        w.start = start if start >= 0 else None
        if w.middle is not None and w.last_line is not None:
            middle, last = w.middle - lines, w.last_line - lines
            w.middle, w.last_line = (middle, last) if middle >= 0 else (None, None)

    def forget_window(self) -> None:
        self.window = Window()


class FileStates:
    """FileStates by key, for callers that name files instead of holding their state."""

    MAX = 64

    def __init__(self):
        self._states: OrderedDict[str, FileState] = OrderedDict()

    def get(self, key: str) -> FileState:
        """The state of `key`, made on first use (the least recently used beyond MAX go)."""
        return lru_get(self._states, key, FileState, self.MAX)

    def peek(self, key: str) -> FileState | None:
        return self._states.get(key)

    def of(self, file: FileState | None, key: str | None) -> FileState | None:
        """The per-file state a call uses: the caller's (`file`: the server's model worker owns
        one per open document), else the one kept here for `key` (made on first use); None without either."""
        if file is not None:
            return file
        return None if key is None else self.get(key)

    def place(self, key: str | None, file: FileState | None = None) -> Place | None:
        """The last generation answered for `key` (in `file`, when given), or None."""
        state = file if file is not None else (self.peek(key) if key is not None else None)
        return None if state is None else state.place

    def forget(self, key: str) -> None:
        self._states.pop(key, None)

    def places(self) -> int:
        return sum(s.place is not None for s in self._states.values())
