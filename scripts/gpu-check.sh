#!/usr/bin/env bash
# The GPU check in one command (docs/gpu.md): run from anywhere; writes gpucheck.json,
# gpucheck.md and gpucheck.log to $OUT (default ./gpucheck-out). Extra arguments go to
# `python -m ditto_bench.gpucheck` (e.g. --tiny --device cpu for a quick CPU run). Its last phase
# measures tree passes (ditto_bench/gputree.py; docs/gpu.md, "Trees"): tree rows against plain
# decoding, the engine with tree drafts, and the projection of docs/perf/acceptance-trees.json.
#
# It needs torch and transformers only (the device machine has both). Wheels in .whl/ at
# the repository root, if any travelled, are installed first into /tmp/ditto-site.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
if compgen -G ".whl/*.whl" >/dev/null; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/ditto-site .whl/*.whl
    export PYTHONPATH="/tmp/ditto-site${PYTHONPATH:+:$PYTHONPATH}"
fi
out="${OUT:-gpucheck-out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# 470 s: the check budgets itself (--budget-s, 420 s of phases on CUDA) and rewrites its
# JSON after every phase; the timeout only guards against a hang, inside 8 minutes.
timeout 470 "$python" -m ditto_bench.gpucheck --out "$out" "$@" 2>&1 | tee "$out/gpucheck.log"
