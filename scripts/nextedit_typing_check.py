"""How long the completion for the user's typing waits behind a `judged` next edit (docs/nextedit.md, "In
the server"). A real server (`ditto-lsp serve --next-edit-proposer judged`, the default model, one thread)
opens pallets/click's src/click/formatting.py, the user renames `measure_table` at its definition and asks
for the next edit (the judge scores the next use: seconds on one CPU core); one second later they type at
the file's end and ask for a completion there. Printed: when each answer came. NO_NE=1 asks for no next
edit (the completion alone).

    .venv/bin/python scripts/nextedit_typing_check.py /work/.mirror/pallets+click/repo  # a clone or its .git
"""
import os
import subprocess
import sys
import time

from ditto_bench.client import RawClient


def main(click: str) -> None:
    git_dir = os.path.join(click, ".git") if os.path.isdir(os.path.join(click, ".git")) else click
    text = subprocess.run(["git", "--git-dir", git_dir, "show", "HEAD:src/click/formatting.py"],
                          capture_output=True, text=True, check=True).stdout
    uri = "file:///tmp/ditto-typing-check/formatting.py"
    c = RawClient(["--next-edit-proposer", "judged"], env={"OMP_NUM_THREADS": "1", "DITTO_LLAMA_THREADS": "1"})
    try:
        c.initialize({})
        c.wait_ready(600)
        c.open(uri, text)
        lines = text.split("\n")
        line = next(i for i, s in enumerate(lines) if s.startswith("def measure_table("))
        col = len("def measure_")

        def at(ln, ch):
            return {"line": ln, "character": ch}

        c.change(uri, 2, [{"range": {"start": at(line, col), "end": at(line, col + 5)}, "text": ""}])
        c.change(uri, 3, [{"range": {"start": at(line, col), "end": at(line, col)}, "text": "columns"}])
        ne = None if os.environ.get("NO_NE") else c.request(
            "ditto/nextEdit", {"textDocument": {"uri": uri}, "position": at(line, col + 7)})
        time.sleep(1.0)  # the judge runs; the user types on at the file's end
        last = len(lines) - 1
        c.change(uri, 4, [{"range": {"start": at(last, 0), "end": at(last, 0)}, "text": "def "}])
        t1 = time.monotonic()
        c.wait(c.inline(uri, last, 4), 120)
        t2 = time.monotonic()
        if ne is not None:
            c.wait(ne, 120)
        ne_at = f"{c.responses[ne][1] - t1:+.2f} s" if ne is not None else "not asked"
        print(f"after the typing: the next edit answered {ne_at}, the completion {t2 - t1:+.2f} s; "
              f"next_edit stats {c.stats()['next_edit']}")
        c.shutdown_and_exit()
    finally:
        c.kill()


if __name__ == "__main__":
    main(sys.argv[1])
