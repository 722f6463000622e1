"""What a `ditto-lsp bench` run records about itself and hands over.

The prompt budget a run's Completer gets (`budget`), the versions, machine and replayed commit that
meta records (`versions`, `machine`, `repo_commit`), another device's pass costs for the adaptive
policy (`priced`, `--pass-costs`), the last step of every mode: results.json, report.md and
plots under --out, or the JSON on stdout (`write_results`), and JSON files read and written plain or
gzipped (`read_json`, `write_json`: the data under docs/perf).

Left out on purpose: running systems (runner.py, replay_run.py) and what the report says (report.py).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path


def read_json(path: Path | str):
    """A JSON file, gzipped where its name ends in .gz."""
    import gzip

    raw = Path(path).read_bytes()
    return json.loads(gzip.decompress(raw) if str(path).endswith(".gz") else raw)


def write_json(path: Path, data) -> None:
    """Compact JSON, one line, gzipped where the name ends in .gz (without a timestamp: the same data
    gives the same bytes)."""
    import gzip

    raw = (json.dumps(data, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")
    Path(path).write_bytes(gzip.compress(raw, 9, mtime=0) if str(path).endswith(".gz") else raw)


def budget(total: int | None, mode: str = "completion"):
    from lsp_server.completion.context import ContextBudget

    if total is None:
        if mode == "session":
            from lsp_server.settings import Settings

            # the server's default (fitted to the machine by each server: its `ditto/stats` says what it chose)
            return ContextBudget.scaled(Settings.context_tokens or ContextBudget.DEFAULT_TOTAL)
        total = 1024
    if total < 64:
        raise SystemExit("ditto-lsp: error: --context-tokens must be at least 64")
    return ContextBudget(total=total, above=total // 2, below=total // 5, snippets=total // 4)


def versions() -> dict:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "xllamacpp", "ditto-lsp"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    try:
        import subprocess

        out["ditto_commit"] = subprocess.run(["git", "-C", str(Path(__file__).resolve().parents[1]), "rev-parse",
                                              "--short", "HEAD"], capture_output=True, text=True).stdout.strip() or None
    except OSError:
        out["ditto_commit"] = None
    return out


def repo_commit(repo) -> str | None:
    """HEAD of the replayed repository."""
    import subprocess

    try:
        return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                              text=True).stdout.strip() or None
    except OSError:
        return None


def machine(lm=None) -> dict:
    """The machine; `lm` None: no model loaded in this process (the editor replay's servers hold them)."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    device = lm.describe()["device"] if lm is not None else "cpu"
    gpu = torch.cuda.get_device_name(device) if device.startswith("cuda") else None
    cores = os.cpu_count()
    return {"cpu": cpu, "cores": cores, "gpu": gpu, "platform": platform.platform(), "torch_threads": torch.get_num_threads(),
            "backend_threads": lm.describe().get("threads", torch.get_num_threads()) if lm is not None else None,
            "summary": f"{gpu or cpu}, {cores} cores"}



def priced(args, completer) -> dict:
    """--pass-costs: the policy prices drafts with another device's pass costs (and stops learning
    them from this machine's passes); what meta["priced_with"] records."""
    from ditto_bench.projection import fixed_costs, gpu_costs

    if args.pass_rows < 2:
        raise SystemExit("ditto-lsp: error: --pass-rows must be at least 2")
    try:
        gpu = gpu_costs(args.pass_costs)
    except (OSError, ValueError) as err:
        raise SystemExit(f"ditto-lsp: error: --pass-costs: {err}") from None
    costs = fixed_costs(gpu, args.pass_rows) if gpu["curve"] != "given" else gpu["costs_ms"]
    spec = completer.engine.use_costs(costs)
    spec.learn = False  # this machine's pass times must not move a GPU's costs
    print(f"pricing passes with {args.pass_costs} ({gpu.get('device') or 'given costs'}): "
          f"{', '.join(f'T({n}) {ms:.2f} ms' for n, ms in costs.items())}", file=sys.stderr)
    return {**gpu, "costs_ms": {str(n): ms for n, ms in costs.items()},
            "measured_ms": {str(n): ms for n, ms in gpu["costs_ms"].items()},
            "rows": args.pass_rows if gpu["curve"] != "given" else None}



def write_results(args, results: dict, stopped: str) -> int:
    from ditto_bench import report

    if args.out:
        report.write(results, args.out)
        print(f"wrote {args.out / 'results.json'}, {args.out / 'report.md'} and {len(results['plots'])} plots",
              file=sys.stderr)
        print(report.markdown(results).split("\n## Plots")[0])
    else:
        print(json.dumps({"meta": results["meta"], "summary": results["summary"]}, indent=1))
    return 130 if stopped.startswith("interrupted") else 1 if stopped.startswith("error") else 0

