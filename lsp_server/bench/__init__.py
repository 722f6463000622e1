"""`ditto-lsp bench`: commit-replay benchmarks (DESIGN.md section 6). Submodules import torch lazily."""
