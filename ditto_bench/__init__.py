"""`ditto-lsp bench`: commit-replay benchmarks (docs/benchmark.md). Submodules import torch lazily."""
