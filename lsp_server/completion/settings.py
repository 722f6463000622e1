"""What a Completer call is asked to do (`CompleterSettings`): the drafter, the draft model, the
prompt budget and the ghost text's shape.

A request brings its own (the server builds them from the user's settings, lsp_server/settings.py
`completer_settings`); a Completer keeps the ones it was built with as the default. Its own
module so that the Completer's parts (prompts.py, drafting.py, place.py) name the type without
importing the Completer. Left out on purpose: the user's option list (lsp_server/settings.py),
decoding options (lsp_server/decoding/types.py `DecodeOptions`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lsp_server.completion.context import ContextBudget
from lsp_server.completion.show import RULES, ShowRule


@dataclass
class CompleterSettings:
    drafter: str = "ngram"  # one of drafters.registry.DRAFTERS
    draft_model: str = "qwen2.5-coder-0.5b"  # model spec of the model / hybrid drafters
    history_tokens: int = 4096  # accepted completions kept in the n-gram index (oldest dropped)
    multiline: bool = True  # ghost text may span lines (until the block ends)
    type_through: bool = True  # typing the start of the shown suggestion answers with its rest at once
    # The prompt budget; None: the one that fits this machine (build.py `fitting_budget`), with
    # snippets of the other open buffers from `snippets` (ContextBudget.SOURCES).
    budget: ContextBudget | None = field(default_factory=ContextBudget.default)
    snippets: str = "heads"
    whole_file: bool = False  # the whole file above the place once its prefix KV is filled (wholefile.py)
    # The budget's shares, at most, of the definitions and the recent edits a call brings (extras.py), when
    # the budget is fitted (`budget` None); a budget given has its own (ContextBudget.definitions, .edits).
    definitions_share: float = 0.0
    edits_share: float = 0.0
    show: ShowRule = RULES["all"]  # what of a suggestion reaches the screen (show.py); a bare Completer shows all
