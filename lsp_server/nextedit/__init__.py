"""Next-edit suggestions: after the user changes something, the change that follows, often elsewhere.

- history.py: a document's recent edits, bounded (`EditHistory`, `EditHistories`);
- learn.py: what the user's edit was, as token-level changes and whole lines;
- propagate.py, lines.py: where the same change still applies (`Propagator`, no model);
- rewrite.py: the default model writes a region anew, the region itself the draft (`Rewriter`);
- judge.py: propagation's proposal shown where the model finds the document more likely with it (`Judged`);
- types.py: what a proposer answers (`NextEdit`).
docs/nextedit.md says how they work and what they measured. Left out on purpose: LSP (the server's
`ditto/nextEdit` request calls a proposer with the document's history and text).
"""

# The proposers by name (the server's `next_edit_proposer` setting, the benchmark's systems): edit propagation,
# the model's rewrite of the places propagation looks at, propagation's proposal checked by that rewrite, and
# propagation's proposal judged by the model's likelihood of the document with it.
PROPOSERS = ("propagate", "rewrite", "both", "judged")
DEFAULT_PROPOSER = "propagate"  # the one a user gets by default (docs/nextedit.md, "Off by default, because it does worse")
