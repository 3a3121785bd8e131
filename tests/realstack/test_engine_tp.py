"""lmdeploy's tensor-parallel engine on the simulated NPU: tp=2 with the mp executor (two workers lmdeploy spawns,
its device groups on the simulator's ``hccl`` backend over gloo, its own gloo CPU group), graph mode by vendor_graph
on both ranks, against a one-card eager run of the same workload; then the same with a capture fault on rank 1.

Each run is a child interpreter started with the simulator switch (``VENDOR_GRAPH_SIM``) and the real dlinfer
(:func:`vendor_graph_sim.engine.main`, the Llama checkpoint, 2 query heads and 1 KV head, which lmdeploy replicates
across the two ranks). Greedy tokens of the tp=2 graph run must equal the tp=1 eager run's, and each rank must
capture and replay. In the fault run a ``sitecustomize`` on the child's ``PYTHONPATH`` (every process lmdeploy
spawns imports it) makes vendor_graph's first capture fail in the worker of rank 1 only (the first captured key:
the largest bucket, 6): vendor_graph's rank agreement, one gather on lmdeploy's CPU group at each capture, must send
that key eager on both ranks (each stats file names it: no graph for bucket 6, its steps eager with the injected
reason on rank 1 and "capture failed on rank(s) [1]" on rank 0), the other keys replay on both, the tokens still
equal one-card eager, and the run ends. Without the agreement rank 0 replays the key while rank 1 runs it eagerly,
their collectives differ (6 padded rows against 5) and the simulator's hccl fails the step on both ranks.

No wait is unbounded: the child ends itself (status 124, with its threads' stacks) when its runs exceed ``--timeout``
(lmdeploy's engine waits for its workers forever, and a worker whose forward loop failed stays alive, idle), and the
test kills the child's process group if even that does not come.

Once per test run, with the newest lmdeploy release only (``newest_release_only``): what this checks (the
simulator's collectives inside captured graphs, the rank agreement over lmdeploy's CPU group) is the same code on
every release, and each run starts two full engines (about half a minute on two cores); test_engine.py runs the
engine on every release at tp=1. One model, the default ten requests, the newest generation only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from once_per_run import newest_release_only

pytestmark = newest_release_only

OURS = "vendor_graph.vendors.ascend.runner.AscendGraphRunner"
GENERATION = "G5"
TIMEOUT_S = 420  # the child's own bound (--timeout); the test waits a minute longer
FAULTED_BUCKET = "6"  # lmdeploy captures the largest size first: rank 1's first capture
INJECTED = "injected: capture fault on rank 1"

FAULT_HOOK = textwrap.dedent('''
    """Test hook (tests/realstack/test_engine_tp.py): in lmdeploy's worker of rank 1, vendor_graph's first capture
    fails (the model's forward raises inside the capture)."""


    def _arm(module):
        import torch.distributed as dist

        from vendor_graph.vendors.ascend import hook

        cls = module.LlamaForCausalLM
        forward = cls.forward
        raised = []

        def forward_failing_once_on_rank_1(self, *args, **kwargs):
            if not raised and hook.capturing() and dist.is_initialized() and dist.get_rank() == 1:
                raised.append(True)
                raise RuntimeError("INJECTED")
            return forward(self, *args, **kwargs)

        cls.forward = forward_failing_once_on_rank_1


    try:
        from vendor_graph.install import patching
    except ImportError:  # an interpreter without vendor_graph (a helper process)
        patching = None
    if patching is not None:
        patching.when_imported("lmdeploy.pytorch.models.llama", _arm)
''').replace('"INJECTED"', repr(INJECTED))


def serve_tp2(tmp_path: Path, hook: str | None = None) -> dict:
    """``python -m vendor_graph_sim.engine``: the Llama model at tp=2 (mp executor) in graph mode against tp=1
    eager; ``hook``: a sitecustomize for every process of the run. The entry of the one comparison."""
    out = tmp_path / "tp2.json"
    env = {k: v for k, v in os.environ.items() if k not in ("VENDOR_GRAPH_VENDOR", "PYTHONPATH")}
    env.update(VENDOR_GRAPH_SIM=GENERATION, OMP_NUM_THREADS="1")
    if hook is not None:
        (tmp_path / "hook").mkdir()
        (tmp_path / "hook" / "sitecustomize.py").write_text(hook)
        env["PYTHONPATH"] = str(tmp_path / "hook")
    command = [sys.executable, "-m", "vendor_graph_sim.engine", str(out), "--models", "lmdeploy-llama",
               "--executor", "mp", "--tp", "2", "--eager-tp", "1", "--timeout", str(TIMEOUT_S)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=str(tmp_path), start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S + 60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the child's session: it and the workers it spawned
        proc.communicate()
        pytest.fail(f"the tp=2 engine run hung past {TIMEOUT_S + 60} s and did not end itself")
    errors = "\n".join(line for line in stderr.splitlines() if " ERROR " in line or "Error:" in line)
    assert proc.returncode != 124, f"the tp=2 engine run hung (ended by its --timeout):\n{errors}\n{stderr[-4000:]}"
    assert proc.returncode == 0, f"the tp=2 engine run failed:\n{errors[-4000:]}"
    result = json.loads(out.read_text())
    assert result["runner"] == "vendor_graph"
    entry, = result["results"]
    assert entry.get("error") is None, entry.get("traceback")
    return entry


def check_tp2_against_one_card_eager(entry: dict, failed_captures: int = 0) -> tuple[dict, dict]:
    """The tp=2 graph run against tp=1 eager: tokens, each rank's runner and what its steps did; each rank's stats.
    ``failed_captures``: capture steps that failed on some rank (each is then neither a capture nor an eager step
    on any rank: its result is the warmup forward's)."""
    eager, graph = entry["eager"], entry["graph"]
    assert (eager["tp"], eager["executor"], graph["tp"], graph["executor"]) == (1, "uni", 2, "mp")
    assert entry["tokens_equal"], entry["first_difference"]
    for run in (eager, graph):
        assert run["finish_reasons"] == ["length"] * run["requests"], run["finish_reasons"]
        assert [len(t) for t in run["tokens"]] == [8 + 3 * i for i in range(run["requests"])]
    ranks = graph["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world_size"] == 2 for r in ranks), ranks
    for r in ranks:
        assert r["runner"] == OURS, r["runner"]
        assert r["captures"] > 0 and r["replays"] > 0, r
        # Every decode step captured, replayed or ran eager, but the failed captures and one: lmdeploy launches
        # the next decode step before it learns that the requests are done, and the executor's close stops the
        # workers in it (SIGTERM; the rank still in a collective then loses its peer). The stats file, written at
        # exit, counts it as decoded.
        eager = sum(n for reason, n in r["eager_steps"].items() if reason != "not a decode step")
        unfinished = sum(r["batch_histogram"].values()) - r["replays"] - r["captures"] - eager
        assert unfinished - failed_captures in (0, 1), r
    assert abs(ranks[0]["replays"] - ranks[1]["replays"]) <= 1  # that step's replay, at most, on one rank only
    return ranks[0], ranks[1]


def test_tp2_graph_mode_serves_the_tokens_of_one_card_eager(tmp_path, dlinfer_available):
    rank0, rank1 = check_tp2_against_one_card_eager(serve_tp2(tmp_path))
    for r in (rank0, rank1):
        assert set(r["eager_steps"]) <= {"not a decode step"}, r["eager_steps"]  # no decode step ran eager
        assert {b for b, stats in r["buckets"].items() if stats["replays"] > 0} == {"1", "2", "4", "6"}, r["buckets"]
    assert rank0["captures"] == rank1["captures"] == 4


def test_a_capture_fault_on_rank_1_sends_that_key_eager_on_both_ranks(tmp_path, dlinfer_available):
    rank0, rank1 = check_tp2_against_one_card_eager(serve_tp2(tmp_path, FAULT_HOOK), failed_captures=1)
    (reason0, steps0), = [(k, n) for k, n in rank0["eager_steps"].items() if k != "not a decode step"]
    (reason1, steps1), = [(k, n) for k, n in rank1["eager_steps"].items() if k != "not a decode step"]
    assert reason0.startswith("capture failed on rank(s) [1]"), reason0
    assert INJECTED in reason1, reason1
    # the bucket's decode steps (batches 5 and 6), less the warmup step whose capture failed: eager on both ranks
    for r, steps in ((rank0, steps0), (rank1, steps1)):
        histogram = r["batch_histogram"]
        assert steps == histogram.get("5", 0) + histogram.get(FAULTED_BUCKET, 0) - 1 > 0, (steps, histogram)
    assert steps0 == steps1
    faulted0, faulted1 = rank0["buckets"].get(FAULTED_BUCKET), rank1["buckets"][FAULTED_BUCKET]
    assert faulted1["capture_failures"] == 1 and faulted1["replays"] == 0, faulted1
    assert faulted0 is None or faulted0["replays"] == 0, faulted0  # rank 0 released the graph it captured
    for r in (rank0, rank1):  # the other keys replay on both ranks
        assert {b for b, stats in r["buckets"].items() if stats["replays"] > 0} == {"1", "2", "4"}, r["buckets"]
