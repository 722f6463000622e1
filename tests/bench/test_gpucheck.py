"""The GPU check (ditto_bench/gpucheck.py, `python -m ditto_bench.gpucheck`) end to end on the CPU with the
tiny model, and its replay arithmetic with injected numbers (no timing is asserted)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ditto_bench.gpucheck import DEFAULT_REPLAY
from ditto_bench.gpucheck_report import compact, decision, project, replay_record

ROOT = Path(__file__).resolve().parents[2]


def bench_results():
    """A results.json of `ditto-lsp bench` in miniature: two tasks, three systems."""
    def rec(task, system, passes, drafted_at, accepted_at, generated):
        return {"task": task, "system": system, "target_passes": passes, "drafted_at": drafted_at,
                "accepted_at": accepted_at, "generated": generated, "drafted": sum(drafted_at),
                "accepted": sum(accepted_at), "identical": True, "text": "x" * 50, "latency_ms": 1.0}

    return {"meta": {"model_spec": "default", "device": "cpu", "dtype": "float32", "command": "ditto-lsp bench ...",
                     "versions": {"torch": "2"}, "task_list_big": [1, 2, 3]},
            "summary": {}, "task_list": [{"id": "a"}],
            "tasks": [rec("a", "off", 20, [], [], 20), rec("a", "ngram", 12, [5, 2], [3, 1], 20),
                      rec("a", "ngram-k8", 10, [6, 4, 1], [4, 2, 1], 20), rec("b", "ngram-k8", 5, [2], [2], 8),
                      rec("b", "ngram-k16", 4, [3, 3, 3, 3], [3, 3, 2, 1], 8)]}


def test_replay_rebuilds_the_rounds_from_drafted_at():
    r = replay_record(bench_results(), rows=9)
    assert r["system"] == "ngram-k8"  # the longest fixed length that fits 9 rows; ngram-k16 does not
    # task a: 10 passes, 6 verified >= 1 draft, 4 >= 2, 1 >= 3 -> {0: 4, 1: 2, 2: 3, 3: 1}; task b: {0: 3, 1: 2}
    assert r["verified_hist"] == {"0": 7, "1": 4, "2": 3, "3": 1}
    assert sum(r["verified_hist"].values()) == r["passes"] == 15
    assert r["generated"] == 28 and r["drafted"] == 13 and r["accepted"] == 9
    assert r["tokens_per_pass"] == round(28 / 15, 4)
    assert replay_record(bench_results(), rows=2)["system"] == "ngram"  # no fixed length fits: the adaptive one
    p = project(r, pass_ms=2.0, rows=9)
    assert p["projection"] is True and p["fits_fixed_shape"]
    assert p["tokens_per_s"] == round(28 / (15 * 2.0 / 1000), 2)
    with pytest.raises(ValueError):
        replay_record({"meta": {}}, rows=9)
    with pytest.raises(ValueError):
        replay_record({"tasks": [{"system": "off"}]}, rows=9)


def test_compact_copy_replays_the_same():
    data = bench_results()
    small = compact(data)
    assert all("text" not in t and "latency_ms" not in t for t in small["tasks"])
    assert "task_list_big" not in small["meta"] and small["meta"]["versions"] == {"torch": "2"}
    assert replay_record(json.loads(json.dumps(small)), 9) == replay_record(data, 9)


def test_the_committed_acceptance_record_replays():
    r = replay_record(json.loads(DEFAULT_REPLAY.read_text()), rows=9)
    assert r["system"].startswith("ngram") and r["passes"] > 0 and r["generated"] >= r["passes"]
    assert r["recorded_on"].get("device") == "cpu"
    hist = {int(v): c for v, c in r["verified_hist"].items()}
    assert sum(hist.values()) == r["passes"]  # every recorded pass is one round of the histogram ...
    assert sum(v * c for v, c in hist.items()) == r["drafted"]  # ... and the drafts it verified add up


def test_decision_needs_bf16_on_cuda_and_exactness():
    ok = {"environment": {"device": "cuda", "dtype": "bfloat16"},
          "invariance": {"fixed": {"positions": 10, "bitwise_rows": 10, "argmax_agree": 10}},
          "engine": {"exactness": {"mismatches": 0, "positions": 40, "runs": 4},
                     "systems": {"off": {"tokens_per_s": 300.0}, "off-eager": {"tokens_per_s": 40.0}}}}
    assert decision(ok)["fixed_shape_default_on_cuda"] is True
    bad = json.loads(json.dumps(ok))
    bad["invariance"]["fixed"]["bitwise_rows"] = 9
    assert decision(bad)["fixed_shape_default_on_cuda"] is False
    cpu = json.loads(json.dumps(ok))
    cpu["environment"]["device"] = "cpu"
    assert "not measured in bf16 on CUDA" in decision(cpu)["because"]


def test_gpu_check_runs_end_to_end_on_the_cpu(tmp_path):
    replay = tmp_path / "results.json"
    replay.write_text(json.dumps(bench_results()))
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    args = ["--device", "cpu", "--tiny", "--replay", str(replay), "--context", "24", "--sequences", "1",
            "--positions", "20", "--prompts", "1", "--new-tokens", "12", "--reps", "1", "--max-n", "4"]
    proc = subprocess.run([sys.executable, "-m", "ditto_bench.gpucheck", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((out / "gpucheck.json").read_text())
    assert (out / "gpucheck.md").read_text().startswith("# Ditto GPU check")
    assert "gpucheck.json" in proc.stdout + proc.stderr

    env_ = res["environment"]
    assert env_["device"] == "cpu" and env_["dtype"] == "float32" and env_["cuda_graphs"] is False
    assert env_["rows"] == 9 and env_["architecture"]["num_hidden_layers"] == 2
    costs = res["pass_costs"]
    assert set(costs) == {"eager_dynamic", "eager_static", "fixed_shape"}  # no graphs on the CPU
    assert sorted(costs["eager_dynamic"], key=int) == ["1", "2", "3", "4"]
    assert all(c["best_ms"] > 0 for c in costs["eager_static"].values())

    fixed, unpadded = res["invariance"]["fixed"], res["invariance"]["unpadded_dynamic"]
    assert fixed["positions"] == unpadded["positions"] == 20 and not fixed["cut_short"]
    assert fixed["argmax_agree"] == 20 and fixed["bitwise_rows"] == 20 and fixed["max_abs_diff"] == 0.0
    assert unpadded["argmax_agree"] == 20

    eng = res["engine"]
    assert set(eng["systems"]) == {"hf-greedy", "off-eager", "off", "oracle", "ngram"}
    for name, s in eng["systems"].items():
        assert s["tokens"] > 0 and s["tokens_per_s"] > 0, name
    assert eng["systems"]["oracle"]["passes"] < eng["systems"]["off"]["passes"]
    assert eng["exactness"]["mismatches"] == 0 and eng["exactness"]["runs"] == 4
    assert eng["exactness"]["positions"] == 4 * 12

    rp = res["replay"]
    assert rp["record"]["system"] == "ngram-k8" and rp["projection"]["projection"] is True
    assert rp["projection"]["tokens_per_s"] > 0
    assert set(res["goals"]) == {"off_vs_hf_greedy", "oracle_vs_off", "speculative_equals_plain"}
    assert res["goals"]["speculative_equals_plain"]["met"] is True
    assert res["decision"]["fixed_shape_default_on_cuda"] is False

    # The script runs the tree phase too (float32 here, so rows need not be bit-identical; the
    # engine's output must equal plain decoding all the same).
    t = res["trees"]
    assert t["rows"] == 16 and t["invariance"]["argmax_agree"] == t["invariance"]["rows"] > 0
    assert t["engine"]["exactness"]["mismatches"] == 0 and t["engine"]["exactness"]["tree_passes"] > 0
    assert t["decision"]["trees_default_on_cuda"] is False
    assert "## Trees" in (out / "gpucheck.md").read_text()


def test_gpu_check_measures_the_tree_path_on_the_cpu_in_bf16(tmp_path):
    """The tree phase (ditto_bench/gputree.py) in the configuration the GPU runs, bf16 through the
    fixed shape and static cache, here on the CPU: every tree row has plain decoding's bits, the
    engine with tree drafts equals plain decoding, and a compact run record is projected."""
    from ditto_bench.gpucheck import main

    record = tmp_path / "trees.json"
    record.write_text(json.dumps(projection_results()))
    out = tmp_path / "out"
    assert main(["--device", "cpu", "--tiny", "--dtype", "bfloat16", "--out", str(out), "--context", "24",
                 "--sequences", "1", "--positions", "10", "--prompts", "1", "--new-tokens", "12", "--reps", "1",
                 "--max-n", "2", "--trees", "3", "--trees-replay", str(record)]) == 0
    res = json.loads((out / "gpucheck.json").read_text())
    t = res["trees"]
    assert t["rows"] == 16 and sorted(t["fixed_costs"], key=int) == [str(n) for n in range(1, 17)]
    inv = t["invariance"]
    assert inv["trees"] == 3 and inv["rows"] == 3 * 16 and inv["bitwise_rows"] == inv["rows"] == inv["argmax_agree"]
    ex = t["engine"]["exactness"]
    assert ex["mismatches"] == 0 and ex["runs"] == 2 and ex["tree_passes"] > 0
    assert t["engine"]["oracle_trees"]["passes"] < 12
    assert t["decision"]["trees_default_on_cuda"] is False and "not measured in bf16 on CUDA" in t["decision"]["because"]
    assert t["replay"]["projection"] is True and set(t["replay"]["systems"]) == {"off", "ngram"}
    assert "## Trees" in (out / "gpucheck.md").read_text()


def projection_results():
    """A results.json in miniature with rounds: [match_len, offered, verified, accepted, ms, tree nodes]."""
    return {"meta": {"mode": "completion"}, "tasks": [
        {"task": "a", "system": "off", "generated": 6, "target_passes": 6, "rounds": [[0, 0, 0, 0, 1.0, 0]] * 6},
        {"task": "a", "system": "ngram", "generated": 6, "target_passes": 2, "draft_ms": 1.0,
         "rounds": [[3, 12, 3, 3, 1.0, 12], [0, 0, 0, 0, 1.0, 0]]},
        {"task": "a", "system": "hf-greedy", "generated": 6, "target_passes": 6, "rounds": None}]}


def test_projection_prices_passes_at_the_fixed_shape_they_need():
    from ditto_bench.projection import compact, fixed_costs, project

    gpu = {"device": "GPU", "source": "x", "costs_ms": {1: 3.0, 9: 3.6, 16: 4.0}}
    p = project(projection_results()["tasks"], gpu)
    assert p["projection"] is True
    off, ngram = p["systems"]["off"], p["systems"]["ngram"]
    assert off["rows"] == 9 and off["ms_per_pass"] == 3.6 and off["vs_off"] == 1.0
    # 13 rows -> the 16-row shape: 2 passes x 4.0 ms + 1 ms drafting + one tree pass's bookkeeping
    assert ngram["rows"] == 16 and ngram["tree_passes"] == 1 and ngram["tokens_per_pass"] == 3.0
    ms = 2 * 4.0 + 1.0 + 0.05
    assert ngram["tokens_per_s"] == round(6 / (ms / 1000), 1)
    assert ngram["vs_off"] == round(6 / (ms / 1000) * 3.6 / 1000, 2)
    assert fixed_costs(gpu, 16) == {1: 4.0, 16: 4.0} and fixed_costs(gpu, 12) == {1: 4.0, 12: 4.0}
    small = compact(projection_results())
    assert [t["system"] for t in small["tasks"]] == ["off", "ngram"]
    assert project(small["tasks"], gpu) == p


def test_projection_command_pools_runs_and_leaves_systems_out_of_a_compact_copy(tmp_path, capsys):
    from ditto_bench.projection import main

    gpu = tmp_path / "costs.json"
    gpu.write_text(json.dumps({"1": 3.0, "9": 3.6, "16": 4.0}))
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    one.write_text(json.dumps(projection_results()))
    other = projection_results()
    other["tasks"][1] = {**other["tasks"][1], "task": "b", "generated": 2, "rounds": [[0, 0, 0, 0, 1.0, 0]] * 2,
                         "target_passes": 2}
    two.write_text(json.dumps(other))
    assert main([str(one), str(two), "--gpu", str(gpu), "--json"]) == 0
    ngram = json.loads(capsys.readouterr().out)["systems"]["ngram"]
    # pooled: 6 + 2 tokens over 2 + 2 passes, two of them without a draft
    assert ngram["passes"] == 4 and ngram["tokens_per_pass"] == 2.0 and ngram["no_draft_passes"] == 3
    small = tmp_path / "small.json"
    assert main([str(one), "--save-compact", str(small), "--without", "off"]) == 0
    saved = json.loads(small.read_text())
    assert [t["system"] for t in saved["tasks"]] == ["ngram"] and saved["meta"]["left_out"] == "off"
    with pytest.raises(SystemExit, match="one RESULTS"):
        main([str(one), str(two), "--save-compact", str(small)])
