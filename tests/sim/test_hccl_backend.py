"""The simulator's ``hccl`` process-group backend (lmdeploy's device groups on Ascend), over gloo on loopback.

Two ranks (processes) run collectives on simulated NPU tensors eagerly (asynchronous to the host: a rank's
collective returns before its peer issues its own, and the stream's later work waits for it), after queued work
(``eager_drain`` off), and inside a captured graph: the capture runs nothing and each replay runs the collective
again on the contents its tensors have then, so two replays with new contents give new, right results on both
ranks. A collective that the ranks issue with different sizes, or with a dead peer, fails on the living ranks
within the group's bound when the host reads its result (never hangs: gloo's own check of mismatched buffers
would abort the process), and so does one a peer never issues (lmdeploy asks for a 35600-day timeout; the group
caps it). In this process: a single-rank group for what needs no peer (stream order, the capture rules, refusals).
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist
from vendor_graph_sim import device as sim
from vendor_graph_sim.device import _hccl

BOUND_S = 10  # the groups' collective timeout in the rank scripts
RANK_SCRIPT = textwrap.dedent("""
    import datetime, json, os, sys, time

    import torch
    import torch.distributed as dist

    from vendor_graph_sim import device as sim
    from vendor_graph_sim.device import _hccl

    rank, world, port, out, scenario, bound = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4],
                                               sys.argv[5], float(sys.argv[6]))
    sim.install()
    _hccl.MAX_TIMEOUT = datetime.timedelta(seconds=bound)
    dist.init_process_group("hccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(days=365))  # what lmdeploy asks for, more or less
    result = {"backend": dist.get_backend(), "timeout_s": dist.group.WORLD.timeout.total_seconds()}

    def host(t):
        return t.cpu().tolist()

    if scenario == "collectives":
        x = torch.full((2, 3), float(rank + 1), device="npu", dtype=torch.float16)
        dist.all_reduce(x)
        result["all_reduce"] = host(x)
        parts = [torch.empty(3, device="npu") for _ in range(world)]
        dist.all_gather(parts, torch.arange(3, device="npu", dtype=torch.float32) + 10 * rank)
        result["all_gather"] = [host(p) for p in parts]
        gathered = torch.empty(2 * world, device="npu", dtype=torch.int32)
        dist.all_gather_into_tensor(gathered, torch.tensor([rank, rank + 100], device="npu", dtype=torch.int32))
        result["all_gather_into_tensor"] = host(gathered)
        token = torch.tensor([7 + rank], device="npu")
        dist.broadcast(token, src=0, async_op=True).wait()
        result["broadcast"] = host(token)
        mine = torch.empty(2, device="npu")
        dist.reduce_scatter_tensor(mine, torch.arange(2 * world, device="npu", dtype=torch.float32) * (rank + 1))
        result["reduce_scatter_tensor"] = host(mine)
        dist.barrier()
        if rank == 1:  # asynchronous to the host: rank 0's all_reduce returns before rank 1 issues its own
            time.sleep(2)
        z = torch.full((2,), float(rank + 1), device="npu")
        start = time.monotonic()
        handle = dist.all_reduce(z, async_op=True)
        result["issue_seconds"] = time.monotonic() - start
        later = z * 10  # stream order: after the all_reduce
        handle.wait()
        result["async"] = host(later)
        with sim.configured(eager_drain=False):  # queued work runs before the collective reads its input
            y = torch.zeros(4, device="npu")
            y.add_(rank + 1)
            dist.all_reduce(y)
            result["after_queued_work"] = host(y)
        side = sim.Stream()
        static = torch.zeros(4, device="npu")
        graph = sim.SimGraph()
        with torch.npu.stream(side):
            graph.capture_begin()
            reduced = static * (rank + 1)
            dist.all_reduce(reduced)
            gathered = static.new_empty(4 * world)
            dist.all_gather_into_tensor(gathered, static)
            graph.capture_end()
        result["recorded"] = graph.describe()
        result["after_capture"] = [host(reduced), host(gathered)]  # the capture ran nothing
        result["replays"] = []
        for k in (1, 2):
            static.copy_(torch.arange(4, device="npu", dtype=torch.float32) + 10 * k + rank)
            with torch.npu.stream(side):
                graph.replay()
            torch.npu.synchronize()
            result["replays"].append([host(reduced), host(gathered)])
    elif scenario == "mismatch":  # rank 0 reduces 4 elements, rank 1 six
        start = time.monotonic()
        try:
            x = torch.ones(4 if rank == 0 else 6, device="npu")
            dist.all_reduce(x)
            host(x)
            result["error"] = None
        except RuntimeError as exc:
            result["error"] = str(exc)
        result["seconds"] = time.monotonic() - start
    elif scenario == "absent":  # rank 1 lives but never issues the collective
        if rank == 1:
            time.sleep(bound + 5)
            os._exit(0)
        start = time.monotonic()
        try:
            x = torch.ones(4, device="npu")
            dist.all_reduce(x)  # the host goes on: the failure comes at the read
            host(x)
            result["error"] = None
        except RuntimeError as exc:
            result["error"] = str(exc)
        result["seconds"] = time.monotonic() - start
    elif scenario == "dead":  # rank 1 is gone before the collective
        if rank == 1:
            os._exit(0)
        start = time.monotonic()
        try:
            x = torch.ones(4, device="npu")
            dist.all_reduce(x)  # the host goes on: the failure comes at the read
            host(x)
            result["error"] = None
        except RuntimeError as exc:
            result["error"] = str(exc)
        result["seconds"] = time.monotonic() - start
    with open(out, "w") as f:
        json.dump(result, f)
    os._exit(0)  # no teardown of a group whose peer may be gone
""")


def run_ranks(tmp_path, scenario: str, world: int = 2) -> list[dict | None]:
    """``RANK_SCRIPT`` as ``world`` processes; what each wrote (None for a rank that wrote nothing). A rank still
    running after twice the collective bound plus start-up fails the test: a hang."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(script), str(rank), str(world), str(port),
                               str(tmp_path / f"{scenario}{rank}.json"), scenario, str(BOUND_S)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(world)]
    limit = 120 + 2 * BOUND_S
    outputs = []
    try:
        for rank, proc in enumerate(procs):
            try:
                outputs.append(proc.communicate(timeout=limit)[0])
            except subprocess.TimeoutExpired:
                pytest.fail(f"{scenario}: rank {rank} still runs after {limit} s: a collective hangs")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results = []
    for rank, proc in enumerate(procs):
        path = tmp_path / f"{scenario}{rank}.json"
        assert proc.returncode == 0, f"{scenario}: rank {rank} failed:\n{outputs[rank][-3000:]}"
        results.append(json.loads(path.read_text()) if path.is_file() else None)
    return results


def test_collectives_run_eagerly_and_replay_from_a_captured_graph_on_both_ranks(tmp_path):
    for rank, r in enumerate(run_ranks(tmp_path, "collectives")):
        assert r["backend"] == "hccl" and r["timeout_s"] == BOUND_S  # lmdeploy's 35600 days, capped
        assert r["all_reduce"] == [[3.0] * 3] * 2
        assert r["all_gather"] == [[0.0, 1.0, 2.0], [10.0, 11.0, 12.0]]
        assert r["all_gather_into_tensor"] == [0, 100, 1, 101]
        assert r["broadcast"] == [7]
        # sum over ranks of arange(4) * (rank + 1) = 3 * arange(4); this rank's half
        assert r["reduce_scatter_tensor"] == [3.0 * (2 * rank), 3.0 * (2 * rank + 1)]
        assert r["after_queued_work"] == [3.0] * 4
        assert r["async"] == [30.0, 30.0]
        if rank == 0:
            assert r["issue_seconds"] < 1, r["issue_seconds"]  # it did not wait the 2 s for rank 1
        assert r["recorded"] == ["mul.Tensor", "hccl.all_reduce", "hccl.all_gather_into_tensor"], r["recorded"]
        reduced, gathered = r["after_capture"]
        assert all(v != v for v in reduced + gathered), "the capture ran work (outputs are not poison)"
        for k, (reduced, gathered) in zip((1, 2), r["replays"], strict=True):
            base = [float(i + 10 * k) for i in range(4)]  # rank 0's static; rank 1's is base + 1
            assert reduced == [b * 1 + (b + 1) * 2 for b in base], (k, reduced)
            assert gathered == base + [b + 1 for b in base], (k, gathered)


def test_a_collective_with_mismatched_sizes_fails_on_both_ranks_within_the_bound(tmp_path):
    for rank, r in enumerate(run_ranks(tmp_path, "mismatch")):
        assert r["error"] is not None, f"rank {rank}: mismatched all_reduce succeeded"
        assert "the ranks issued different collectives" in r["error"], r["error"]
        assert "rank 0: all_reduce of 4 x torch.float32; rank 1: all_reduce of 6 x torch.float32" in r["error"]
        assert r["seconds"] < BOUND_S


def test_a_collective_a_peer_never_issues_fails_after_the_bound_not_lmdeploys_35600_days(tmp_path):
    waiting, absent = run_ranks(tmp_path, "absent")
    assert absent is None
    assert waiting["error"] is not None and "timed out after 10 s" in waiting["error"], waiting["error"]
    assert BOUND_S - 1 <= waiting["seconds"] <= BOUND_S + 5


def test_a_collective_with_a_dead_peer_fails_within_the_bound(tmp_path):
    alive, gone = run_ranks(tmp_path, "dead")
    assert gone is None
    assert alive["error"] is not None and "hccl all_reduce on group" in alive["error"], alive["error"]
    assert alive["seconds"] <= BOUND_S + 5


# -- one rank, in this process ---------------------------------------------------------------------------


@pytest.fixture
def group():
    return _hccl.HcclProcessGroup(dist.HashStore(), 0, 1, datetime.timedelta(seconds=5))


def test_hccl_is_registered_for_the_simulated_device():
    assert "hccl" in dist.Backend.backend_list
    assert dist.Backend.default_device_backend_map[sim.installed()] == "hccl"
    assert _hccl.register()  # idempotent


def test_a_collective_is_queued_behind_the_streams_work_and_runs_when_the_host_reads(group, lazy):
    x = torch.zeros(3, device="npu")
    x.add_(2)
    group.allreduce([x])
    queued = sim.pending_work()[sim.current_stream()]
    assert queued[-2:] == ["add_.Tensor", "hccl.all_reduce"], queued  # nothing ran: the add first, then it
    assert sim.counters.by_op["hccl.all_reduce"] == 1
    assert x.cpu().tolist() == [2.0] * 3  # one rank: the sum is its own
    assert not sim.pending_work()


def test_a_collective_behind_a_wait_nothing_satisfies_fails_at_the_sync_instead_of_hanging(group, lazy):
    event = sim.ExternalEvent()
    event.wait()
    x = torch.ones(3, device="npu")
    group.allreduce([x])  # the host goes on
    start = time.monotonic()
    with pytest.raises(sim.SimDeadlockError, match="would wait forever"):
        x.cpu()
    assert time.monotonic() - start < 5


def test_a_captured_collective_is_a_graph_task_and_a_barrier_cannot_be_captured(group):
    static = torch.ones(2, device="npu")
    graph = sim.SimGraph()
    side = sim.Stream()
    with torch.npu.stream(side):
        graph.capture_begin()
        group.allreduce([static])
        assert sim.counters.by_op["hccl.all_reduce"] == 0  # recorded, not run
        with pytest.raises(sim.SimCaptureError, match="barrier"):
            group.barrier()
        sim.discard_queued_work()
    assert graph.status == "aborted"


def test_host_tensors_are_refused(group):
    with pytest.raises(RuntimeError, match="must be on the simulated npu device.*gloo group"):
        group.allreduce([torch.ones(2)])
