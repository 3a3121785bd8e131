"""lmdeploy's own engine and ``pipeline()`` on the simulated NPU, graph mode by vendor_graph against
``eager_mode=True``: the main job, as a user runs it.

Each generation runs in a child interpreter started with ``VENDOR_GRAPH_SIM`` (the simulator switch) and the
dlinfer of ``VENDOR_GRAPH_DLINFER_SRC``; the child is a user's script: ``import vendor_graph.ascend``, then the
pipeline (:func:`vendor_graph_sim.engine.main`). The workload queues requests behind ``max_batch_size`` 6; they
join mid-run and finish at different lengths, so the decode batch shrinks inside a bucket (5 in the graph of 6,
3 in the graph of 4) and crosses buckets. Greedy tokens must be equal, every request must run to its length,
lmdeploy must have built vendor_graph's runner, and no decode step may run eager.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from engine_checks import FULL, GENERATIONS, RELEASE, check_pair
from vendor_graph_sim import engine, realstack

DLINFERS = "dlinfer.framework.lmdeploy_ext.cudagraph.ascend_cudagraph.AscendGraphRunner"
# What stops lmdeploy's engine on this stack without vendor_graph's bridges (tests/lmdeploy/test_bridges.py proves
# each one's detection): 0.16/0.17 build no cache engine, 0.18 prefills nothing.
NEEDED_BRIDGES = {"0.16": ["state-cache"], "0.17": ["state-cache"], "0.18": ["prefill-attention"]}


def serve(tmp_path: Path, generation: str, *args: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    out = tmp_path / f"{generation}.json"
    env = {k: v for k, v in os.environ.items() if k not in ("VENDOR_GRAPH_VENDOR", "PYTHONPATH")}
    env.update(VENDOR_GRAPH_SIM=generation, OMP_NUM_THREADS="1", VENDOR_GRAPH_STATS_FILE=str(tmp_path / "stats.json"))
    proc = subprocess.run([sys.executable, "-m", "vendor_graph_sim.engine", str(out), *args], capture_output=True,
                          text=True, timeout=900, env=env, cwd=str(tmp_path))
    return proc, (json.loads(out.read_text()) if out.is_file() else None)


@pytest.mark.parametrize("generation", GENERATIONS)
def test_lmdeploy_engine_serves_the_same_tokens_in_graph_mode_as_eager(tmp_path, generation, dlinfer_available):
    cases = ["basic", "prefix-auto"] if generation == FULL else ["basic"]
    proc, result = serve(tmp_path, generation, "--cases", *cases)
    if generation == "G0":  # no ExternalEvent: dlinfer's Ascend package itself does not import, so lmdeploy exits
        assert result is None and proc.returncode != 0
        assert "has no attribute 'ExternalEvent'" in proc.stdout + proc.stderr, proc.stderr[-3000:]
        return
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert result["runner"] == "vendor_graph" and result["torch_npu"] == realstack.pinned_release(generation)
    assert result["bridges"] == NEEDED_BRIDGES[RELEASE]
    by_case = {(r["model"], r["case"]): r for r in result["results"]}
    assert set(by_case) == {(m, c) for m in engine.MODELS for c in cases}
    # the stats file written at exit, after every pipeline was closed (lmdeploy resets its runner then), holds the
    # whole run: what the next run's VENDOR_GRAPH_GRAPH_MEMORY=auto and VENDOR_GRAPH_PLAN=auto read
    written = json.loads((tmp_path / "stats.json").read_text())
    files = written.get("runners", [written])
    graph_runs = [r["graph"] for r in result["results"]]
    assert sum(f["replays"] for f in files) == sum(g["replays"] for g in graph_runs) > 0
    assert sum(f["captures"] for f in files) == sum(g["captures"] for g in graph_runs) > 0
    assert sum(f["decode_steps"] for f in files) >= sum(sum(g["histogram"].values()) for g in graph_runs)
    for (model, case), entry in by_case.items():
        check_pair(entry, f"{model} {case} on {generation}")
        for run in (entry["eager"], entry["graph"]):
            if case == "prefix-auto":  # requests after the first prefill over the shared prefix's cached blocks
                assert run["prefill_kernels"].get("paged_prefill_attention", 0) > 0, run["prefill_kernels"]
                assert run["prefill_cached_tokens"] >= engine.BLOCK_SIZE, "no prompt reused a cached block"
                assert run["num_blocks"] > 1000, "the KV cache was not sized from the simulated free memory"
            else:
                assert run["prefill_kernels"].get("prefill_attention", 0) > 0, run["prefill_kernels"]
                assert run["prefill_cached_tokens"] == 0
                assert run["num_blocks"] == engine.FIXED_BLOCKS


@pytest.mark.skipif(FULL not in GENERATIONS, reason=f"runs in the part of this leg that runs {FULL}")
def test_engine_doctor_shows_the_bridges_this_stack_needs_as_installed(tmp_path, dlinfer_available):
    env = {k: v for k, v in os.environ.items() if k not in ("VENDOR_GRAPH_VENDOR", "PYTHONPATH")}
    env.update(VENDOR_GRAPH_SIM=FULL, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "vendor_graph", "doctor", "--vendor", "ascend"], capture_output=True,
                          text=True, timeout=300, env=env, cwd=str(tmp_path))
    section = proc.stdout.split("Bridges over lmdeploy/dlinfer call gaps")[1].split("\n\n")[0]
    states = {line.split()[0]: line.split(None, 1)[1] for line in section.strip().splitlines()
              if line.startswith("  ") and not line.strip().startswith("fixes:")}
    for name, state in states.items():
        assert state.startswith("installed: ") == (name in NEEDED_BRIDGES[RELEASE]), section
    assert f"ascend  torch_npu (Ascend): simulated by vendor-graph-sim (VENDOR_GRAPH_SIM={FULL})" in proc.stdout


@pytest.mark.skipif(FULL not in GENERATIONS, reason=f"runs in the part of this leg that runs {FULL}")
def test_engine_dlinfers_own_runner_on_the_same_stack(tmp_path, dlinfer_available):
    """vendor_graph not imported, only its bridges installed (without them lmdeploy builds no engine on this
    stack): what dlinfer's own AscendGraphRunner does with the same workload."""
    proc, result = serve(tmp_path, FULL, "--runner", "dlinfer", "--models", "lmdeploy-llama")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert result["bridges"] == NEEDED_BRIDGES[RELEASE]
    entry = result["results"][0]
    if RELEASE != "0.16":  # lmdeploy 0.17+'s builder passes is_mla=, which dlinfer main's runner does not take
        assert "unexpected keyword argument 'is_mla'" in entry["error"], entry
        return
    assert entry.get("error") is None, entry.get("traceback")
    assert entry["tokens_equal"], entry["first_difference"]
    assert entry["graph"]["runner"] == DLINFERS and not entry["graph"]["vendor_graph_active"]
    assert entry["graph"]["replays"] > 0
