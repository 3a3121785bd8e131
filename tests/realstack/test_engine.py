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
from once_per_run import NEWEST
from vendor_graph_sim import engine, realstack

import vendor_graph
from vendor_graph.upstream import compat

DLINFERS = "dlinfer.framework.lmdeploy_ext.cudagraph.ascend_cudagraph.AscendGraphRunner"
# What stops lmdeploy's engine on this stack without vendor_graph's bridges (tests/lmdeploy/test_bridges.py proves
# each one's detection): 0.16/0.17 build no cache engine, 0.18 prefills nothing.
NEEDED_BRIDGES = {"0.16": ["state-cache"], "0.17": ["state-cache"], "0.18": ["prefill-attention"]}


# The hardware workflows run these tests on the vendor's real device (its runtime and dlinfer installed): the engine
# then runs there, not on the simulator (vendor_graph_sim.engine --real-device).
REAL_DEVICE = os.environ.get("VENDOR_GRAPH_REAL_DEVICE", "").strip() or None


def serve(tmp_path: Path, generation: str, *args: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    """``python -m vendor_graph_sim.engine`` on the simulated device ``generation`` names (a torch_npu generation,
    ``camb``, ``maca``), or on the real device of :data:`REAL_DEVICE`."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / f"{generation}.json"
    env = {k: v for k, v in os.environ.items() if k not in ("VENDOR_GRAPH_VENDOR", "PYTHONPATH", "VENDOR_GRAPH_SIM")}
    # the vendor_graph this test imported (a mutation check's changed copy too), never the conftest's stand-in dlinfer
    env["PYTHONPATH"] = str(Path(vendor_graph.__file__).resolve().parents[1])
    env.update(OMP_NUM_THREADS="1", VENDOR_GRAPH_STATS_FILE=str(tmp_path / "stats.json"))
    where = ["--real-device", REAL_DEVICE] if REAL_DEVICE else []
    if not REAL_DEVICE:
        env["VENDOR_GRAPH_SIM"] = generation
    proc = subprocess.run([sys.executable, "-m", "vendor_graph_sim.engine", str(out), *where, *args],
                          capture_output=True, text=True, timeout=900, env=env, cwd=str(tmp_path))
    return proc, (json.loads(out.read_text()) if out.is_file() else None)


@pytest.mark.skipif(REAL_DEVICE not in (None, "ascend"), reason=f"the real device here is {REAL_DEVICE}'s")
@pytest.mark.parametrize("generation", GENERATIONS)
def test_lmdeploy_engine_serves_the_same_tokens_in_graph_mode_as_eager(tmp_path, generation, dlinfer_available):
    if REAL_DEVICE and generation != FULL:
        pytest.skip("on a real NPU the installed torch_npu is the generation: one run")
    cases = ["basic", "prefix-auto"] if generation == FULL else ["basic"]
    proc, result = serve(tmp_path, generation, "--cases", *cases)
    if generation == "G0":  # no ExternalEvent: dlinfer's Ascend package itself does not import, so lmdeploy exits
        assert result is None and proc.returncode != 0
        assert "has no attribute 'ExternalEvent'" in proc.stdout + proc.stderr, proc.stderr[-3000:]
        return
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert result["runner"] == "vendor_graph"
    if not REAL_DEVICE:  # the simulated release, and the bridges the snapshot's dlinfer needs
        assert result["torch_npu"] == realstack.pinned_release(generation)
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
@pytest.mark.skipif(REAL_DEVICE is not None, reason="the simulator's stack: not on a real device")
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
@pytest.mark.skipif(REAL_DEVICE is not None, reason="the simulator's stack: not on a real device")
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


# Camb and MACA: lmdeploy's own CUDA runner, adopted by vendor_graph, on their simulated devices
# (VENDOR_GRAPH_SIM=camb / maca) over the real dlinfer's camb / maca packages with labelled stand-ins for the vendor
# kernels. One run per release and vendor (the part of the leg that runs the newest generation): nothing in it
# depends on torch_npu.
CUDA_STYLE = [v for v in ("camb", "maca") if RELEASE in compat.SUPPORTED_SERIES[v]
              and REAL_DEVICE in (None, v)]
# What the engine needs bridged there: lmdeploy 0.18's prefill call, which no dlinfer takes (breakage 2).
CUDA_STYLE_BRIDGES = {"0.16": [], "0.17": [], "0.18": ["prefill-attention"]}
# Per release, Llama with a fixed cache ("basic": the mutation checks' guard, about 10 s); on the newest release also
# prefix caching over a cache sized from free memory, a Mixtral (a routed MoE in each layer) and, on MACA, DeepSeek-V2
# MLA with prompts of one length (dlinfer's MACA MLA prefill views a batch as (batch, seq, heads, dim); dlinfer's Camb
# decode cannot take MLA at all: the last test).
ENGINE_RUNS = {
    "basic": [["--models", "lmdeploy-llama", "--cases", "basic"]],
    "full": [["--models", "lmdeploy-llama", "--cases", "prefix-auto"],
             ["--models", "lmdeploy-mixtral", "--cases", "basic", "prefix-auto"]],
}
MLA_CASES = {"maca": ["equal-prompts"]}
WHICH = ["basic", "full"] if RELEASE == NEWEST else ["basic"]


@pytest.mark.skipif(FULL not in GENERATIONS, reason=f"runs in the part of this leg that runs {FULL}")
@pytest.mark.parametrize("which", WHICH)
@pytest.mark.parametrize("vendor", CUDA_STYLE)
def test_engine_serves_camb_and_maca_the_same_tokens_in_graph_mode_as_eager(tmp_path, vendor, which,
                                                                           dlinfer_available):
    """``import vendor_graph.<vendor>``, then ``pipeline(device_type=<vendor>)`` (:data:`ENGINE_RUNS`); lmdeploy's
    CUDA runner with vendor_graph's buffer methods in force (dlinfer's own cudagraph patch, imported by lmdeploy, put
    back) replays every decode step."""
    runs = [serve(tmp_path / str(i), vendor, *args) for i, args in enumerate(ENGINE_RUNS[which])]
    if which == "full" and vendor in MLA_CASES:
        runs.append(serve(tmp_path / "mla", vendor, "--models", "lmdeploy-mla", "--cases", *MLA_CASES[vendor]))
    for proc, result in runs:
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert result["runner"] == "vendor_graph" and result["vendor"] == vendor
        assert REAL_DEVICE or result["bridges"] == CUDA_STYLE_BRIDGES[RELEASE]
        for entry in result["results"]:
            where = f"{entry['model']} {entry['case']} on {vendor}"
            check_pair(entry, where)
            for run in (entry["eager"], entry["graph"]):
                assert run["vendor"] == vendor
                methods = {k: v for k, v in run["buffer_methods"].items() if k != "get_outputs_cudagraph"}
                assert set(methods.values()) == {f"vendor_graph.{vendor}"}, f"{where}: {run['buffer_methods']}"
                prefill = "paged_prefill_attention" if entry["case"] == "prefix-auto" else "prefill_attention"
                assert run["prefill_kernels"].get(prefill, 0) > 0, f"{where}: {run['prefill_kernels']}"
                if entry["case"] == "prefix-auto":
                    assert run["prefill_cached_tokens"] >= engine.BLOCK_SIZE, f"{where}: no prompt reused a block"
                    assert run["num_blocks"] > 1000, f"{where}: the cache was not sized from the free memory"


@pytest.mark.skipif(FULL not in GENERATIONS or "camb" not in CUDA_STYLE or RELEASE != NEWEST,
                    reason=f"runs in the part of the newest release's leg that runs {FULL}")
def test_engine_serves_no_camb_mla_as_dlinfers_decode_fails_it_eager_too(tmp_path, dlinfer_available):
    """Breakage 8: dlinfer's camb ``paged_decode_attention`` views its output with the query's head size, which MLA's
    value head size is not: the first decode raises in eager mode already (not vendor_graph's doing). When dlinfer
    fixes it this fails, and MLA joins the Camb test above."""
    proc, result = serve(tmp_path, "camb", "--models", "lmdeploy-mla", "--cases", "basic")
    assert proc.returncode == 0, proc.stderr[-4000:]
    entry = result["results"][0]
    assert "is invalid for input of size" in (entry.get("error") or ""), entry
    assert "camb_ops.py" in entry["traceback"] and "paged_decode_attention" in entry["traceback"]
    assert "eager" not in entry  # compare() runs eager first: it failed there
