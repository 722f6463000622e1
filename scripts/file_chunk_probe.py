"""Issue 40 probe: does the whole file, as a repository-format chunk (`<|file_sep|>path` and the file's
text from its top) before today's window, buy first lines right? docs/perf/README.md ("The whole file
as a chunk before the window") comes from it. It runs `ditto-lsp bench --mode completion` with the
prompt budget fixed (the fit left out) and, with CHUNK > 0, the task's document first among the open
buffers, with CHUNK tokens of room for them ("heads": each buffer from its top):

    OMP_NUM_THREADS=1 DITTO_LLAMA_THREADS=1 taskset -c 1 .venv/bin/python scripts/file_chunk_probe.py \
        CHUNK WINDOW -- bench --repo R --mode completion --systems off --backend llama.cpp --max-tasks 20
    SNIPPETS=none ... file_chunk_probe.py 0 1920 -- ...     # a plain window of that size instead

(`meta.budget` in its results.json is the default's, not the one the prompts were built with.)

The same probe for the lines below the cursor (docs/perf/README.md, "The lines below the cursor"):
BELOW=N gives the suffix N more tokens on top of the window's (the prompt grows by them), SHIFT=N moves
N tokens from the lines above to the lines below (the prompt's size stays):

    BELOW=232 ... file_chunk_probe.py 0 384 -- ...       # the suffix of 24 tokens at 384 made 256
    SHIFT=96 ... file_chunk_probe.py 0 384 -- ...        # 96 of the 192 tokens above moved below
"""
import dataclasses
import os
import sys

from ditto_bench import runner
from lsp_server.cli import main
from lsp_server.completion import completer
from lsp_server.completion.context import ContextBudget

chunk, window = int(sys.argv[1]), int(sys.argv[2])
b = ContextBudget.scaled(window, os.environ.get("SNIPPETS", "heads"))
extra, shift = int(os.environ.get("BELOW", 0)), int(os.environ.get("SHIFT", 0))
budget = dataclasses.replace(b, total=b.total + chunk + extra, snippets=b.snippets + chunk,
                             above=b.above - shift, below=b.below + extra + shift)
completer.Completer.budget_for = lambda self, settings: budget
if chunk:
    plain = runner.Bench.completion_task

    def with_file_first(self, task, systems):
        others = [(n, t) for n, t in task.buffers if n != task.path]
        return plain(self, dataclasses.replace(task, buffers=[(task.path, task.document), *others]), systems)

    runner.Bench.completion_task = with_file_first
sys.exit(main(sys.argv[sys.argv.index("--") + 1:]))
