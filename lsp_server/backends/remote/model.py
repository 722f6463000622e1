"""The loaded remote model: a local tokenizer plus the endpoint (`load`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

from lsp_server.backends.base import GeneratingModel, ModelError, Progress
from lsp_server.backends.remote.generator import RemoteGenerator
from lsp_server.backends.remote.spec import Endpoint, parse_spec
from lsp_server.backends.remote.tokenizers import load_tokenizer
from lsp_server.backends.remote.transport import Transport

log = logging.getLogger(__name__)


class RemoteModel(GeneratingModel):
    """A model a remote engine runs: the text side (a local tokenizer) plus the endpoint.

    It has no tensor side (the engine does not expose forward passes); `generator()`
    gives the Completer its generation step instead of a local Engine.
    """

    kind = "remote"

    def __init__(self, endpoint: Endpoint, tokenizer, transport: Transport):
        self.endpoint = endpoint
        self.tokenizer = tokenizer
        self.transport = transport
        self.spec = endpoint.spec
        self.name = endpoint.served or endpoint.origin
        self.fim = tokenizer.fim
        self.stop_ids = frozenset(tokenizer.stop_ids)
        self.vocab_size = 0
        self.load_seconds = 0.0

    def describe(self) -> dict:
        return {"backend": f"remote ({self.endpoint.engine})", "device": self.endpoint.origin,
                "dtype": "the engine's", "tokenizer": self.tokenizer.source}

    def generator(self) -> "RemoteGenerator":
        return RemoteGenerator(self)

    # -- text side ---------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    def token_text(self, tid: int) -> str:
        return self.tokenizer.token_text(tid)

    def vocabulary(self) -> dict[str, int]:
        return self.tokenizer.vocabulary()

    def special_ids(self) -> dict[str, int | None]:
        return self.tokenizer.special_ids()


def load(spec: str, remote: dict | None, say: Progress) -> RemoteModel:
    endpoint = parse_spec(spec)
    transport = Transport.from_setting(remote)
    for path in (transport.ca_file, transport.cert_file, transport.key_file):
        if path and not Path(path).expanduser().is_file():
            raise ModelError(f"remote TLS file {path!r} does not exist")
    say(f"remote engine {endpoint.url} ({endpoint.engine}); loading the local tokenizer", None)
    tok = load_tokenizer(endpoint.tokenizer, endpoint.served, say, endpoint.engine)
    return RemoteModel(endpoint, tok, transport)
