"""The model worker's side of the server (lsp_server/lsp/threads.py has the rule): its own state
(state.py), idle work (idle.py), the model's next-edit proposers (proposers.py), the engine's debug
hooks (debug.py) and the immutable values the event loop hands it (messages.py). Nothing here imports
pygls, lsprotocol or a module of the event loop's side (tests/test_architecture.py)."""
