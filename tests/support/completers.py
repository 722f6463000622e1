"""The in-process completer a test compares a server's answer with: tiny-random with the settings a
server starts with, the prompt budget fitted to the machine as the server fits it
(lsp_server/completion/build.py; tiny-random's passes are cheap, so 2048 tokens)."""

from __future__ import annotations


def like_the_server(model: str = "tiny-random"):
    from lsp_server.backends.loader import load
    from lsp_server.completion.build import build_completer
    from lsp_server.completion.completer import CompleterSettings

    return build_completer(load(model), CompleterSettings(budget=None), calibration=None)
