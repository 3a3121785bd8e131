"""lmdeploy's engine with its model in spawned workers (``distributed_executor_backend='mp'``), on the simulated
NPU: what every multi-rank setup and many single-card servers run.

The worker sees the parent's simulated NPU, generation and dlinfer through the simulator switch's environment
and activates vendor_graph itself (its autoload); its runner's counts come from the stats file it writes at exit.
A worker that dies, before the engine has started or in the middle of a generation, stops the parent within
seconds with the worker's error and lmdeploy's worker-failure status; before vendor_graph watched the workers,
lmdeploy's executor waited for the dead worker forever (``pipeline()`` hung until it was killed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from engine_checks import FULL, GENERATIONS, OURS, RELEASE, check_pair

from vendor_graph.install.workers import FAILURE_STATUS

# The mp executor's conformance runs on the last release and the oldest one (0.17's executor is 0.18's); the
# worker-failure checks on the last release only: they exercise vendor_graph's watch, the same on every release.
MP_RELEASES = ("0.16", "0.18")
LAST = "0.18"
BOUND_S = 90  # a dead worker must stop the parent well within this (it hung forever before)


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VENDOR_GRAPH_VENDOR", "PYTHONPATH")}
    env.update(VENDOR_GRAPH_SIM=FULL, OMP_NUM_THREADS="1")
    return env


@pytest.mark.skipif(FULL not in GENERATIONS, reason=f"runs in the part of this leg that runs {FULL}")
@pytest.mark.skipif(RELEASE not in MP_RELEASES, reason=f"the mp executor's conformance runs on {MP_RELEASES}")
def test_engine_workers_serve_the_same_tokens_in_graph_mode_as_eager(tmp_path, dlinfer_available):
    out = tmp_path / "mp.json"
    proc = subprocess.run([sys.executable, "-m", "vendor_graph_sim.engine", str(out), "--executor", "mp",
                           "--models", "lmdeploy-llama"], capture_output=True, text=True, timeout=600,
                          env=_env(tmp_path), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    entry = json.loads(out.read_text())["results"][0]
    check_pair(entry, f"mp executor on lmdeploy {RELEASE}", cut_short=1)
    for run in (entry["eager"], entry["graph"]):
        # the counts are the worker's: read from its stats file, written by a process other than this run's
        assert run["executor"] == "mp" and len(run["ranks"]) == 1, run["ranks"]
        rank = run["ranks"][0]
        assert rank["runner"] == OURS and rank["rank"] == 0 and rank["world_size"] == 1
        assert rank["replays"] == run["replays"] and rank["captures"] == run["captures"]
    assert entry["eager"]["ranks"][0]["pid"] != entry["graph"]["ranks"][0]["pid"]


PARENT = textwrap.dedent("""
    import os, sys, threading, time
    from pathlib import Path

    def main():
        from vendor_graph_sim import engine

        import torch_npu  # noqa: F401 - this process's simulated NPU is up before the switch changes below
        import vendor_graph.ascend  # noqa: F401 - the user's import, before lmdeploy
        from lmdeploy import GenerationConfig, PytorchEngineConfig, pipeline

        model = engine.write_model("lmdeploy-llama", Path(sys.argv[2]))
        if sys.argv[1] == "start":  # the workers see a simulator switch they cannot take: they fail to start
            os.environ["VENDOR_GRAPH_SIM"] = "G9-no-such-generation"
        config = PytorchEngineConfig(device_type="ascend", distributed_executor_backend="mp", block_size=16,
                                     session_len=512, num_gpu_blocks=64, max_batch_size=2)
        pipe = pipeline(str(model), backend_config=config, log_level="ERROR")
        print("ENGINE STARTED", flush=True)
        if sys.argv[1] == "kill":
            worker = pipe.async_engine.engine.executor.procs[0]._proc
            threading.Timer(1.0, lambda: os.kill(worker.pid, 9)).start()
        gen = GenerationConfig(top_k=1, do_sample=False, ignore_eos=True, max_new_tokens=400)
        pipe(["bako bami"] * 2, gen_config=gen)
        print("GENERATION RETURNED", flush=True)

    if __name__ == "__main__":
        main()
""")


def _parent(tmp_path: Path, how: str) -> tuple[subprocess.CompletedProcess, float]:
    script = tmp_path / "user_script.py"
    script.write_text(PARENT)
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, str(script), how, str(tmp_path / "model")], capture_output=True,
                              text=True, timeout=BOUND_S, env=_env(tmp_path), cwd=str(tmp_path))
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the engine still waited for its dead worker after {BOUND_S} s: {str(exc.stderr)[-3000:]}")
    return proc, time.monotonic() - start


@pytest.mark.skipif(FULL not in GENERATIONS, reason=f"runs in the part of this leg that runs {FULL}")
@pytest.mark.skipif(RELEASE != LAST, reason=f"vendor_graph's watch of the workers is checked on lmdeploy {LAST}")
def test_engine_workers_that_fail_to_start_stop_the_pipeline_with_their_error(tmp_path, dlinfer_available):
    proc, _ = _parent(tmp_path, "start")
    assert proc.returncode == FAILURE_STATUS, proc.stderr[-3000:]
    assert "ENGINE STARTED" not in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if "lmdeploy's worker ExecutorProc-0" in line]
    assert len(lines) == 1, proc.stderr[-3000:]
    # the worker's own error, read back from it: the switch it could not take, and the fix
    assert "exited with status 1" in lines[0] and "ImportError: VENDOR_GRAPH_SIM='G9-no-such-generation'" in lines[0]
    assert "Fix: name a generation such as G5" in lines[0]


@pytest.mark.skipif(FULL not in GENERATIONS, reason=f"runs in the part of this leg that runs {FULL}")
@pytest.mark.skipif(RELEASE != LAST, reason=f"vendor_graph's watch of the workers is checked on lmdeploy {LAST}")
def test_engine_workers_killed_mid_generation_stop_the_pipeline(tmp_path, dlinfer_available):
    proc, seconds = _parent(tmp_path, "kill")
    assert proc.returncode == FAILURE_STATUS, proc.stderr[-3000:]
    assert "ENGINE STARTED" in proc.stdout and "GENERATION RETURNED" not in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if "lmdeploy's worker ExecutorProc-0" in line]
    assert len(lines) == 1 and "was killed by SIGKILL while the engine was running" in lines[0], proc.stderr[-3000:]
