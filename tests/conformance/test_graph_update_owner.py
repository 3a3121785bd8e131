"""One owner of graph updates per process: two Ascend runners (two engines, or a main and a draft model) replaying
from two threads refresh their graphs' seq-len tasks one at a time, on the task-update and the graph-update path.

The simulated device refuses a task update opened while another thread has one open, as torch_npu 2.10.0.post2
on CANN 9.0.1 does (``graph_task_update_begin`` fails); ``NPUGraph.update`` re-issues through the same calls.
The first thread to open an update in the threaded phase holds it open until the other thread tries to open one
(or for two seconds): with every refresh behind vendor_graph's one owner the other thread waits its turn and
both threads' steps equal eager; with the owner removed the other thread's update fails, every time.
"""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch
from vendor_graph_sim import harness

from vendor_graph.vendors.ascend import runner, seqlen

PLAN = [[0, 1, 2, 3], [0, 1, 2], [0, 1], [0]]  # batches 4, 3 (in the graph of 4), 2, 1: every graph used
ROUNDS = 12


def _contexts_per_thread(mgr) -> None:
    """lmdeploy's step context is one per process (an engine steps from one thread): here each thread's own,
    so that two threads can step two models."""
    local = threading.local()
    mgr.current_context = lambda: getattr(local, "context", None)
    mgr.set_context = lambda context: setattr(local, "context", context)


LINGER_S = 2.0


def _linger_in_the_first_update(monkeypatch) -> None:
    """The first thread to open a task update holds it open until another thread tries to open one (at most
    :data:`LINGER_S`): the threads meet inside an update whenever nothing keeps them apart."""
    from vendor_graph_sim.device import _runtime as rt

    original = rt.task_update_begin
    first: list[int] = []
    other_tried = threading.Event()

    def task_update_begin(stream, handle):
        me = threading.get_ident()
        if first and first[0] != me:
            other_tried.set()
        original(stream, handle)
        if not first:
            first.append(me)
            other_tried.wait(LINGER_S)

    monkeypatch.setattr(rt, "task_update_begin", task_update_begin)


def _replays_from_two_threads(generation: str, monkeypatch) -> tuple[list[BaseException], list[harness.SideBySide]]:
    with contextlib.ExitStack() as stack:
        pairs = [stack.enter_context(harness.ascend_pair(generation, num_seqs=4, seed=seed)) for seed in (0, 1)]
        for mgr in {id(p.model.ctx_mgr): p.model.ctx_mgr for p in pairs}.values():
            _contexts_per_thread(mgr)
        for pair in pairs:  # capture every graph first, in this thread: the threads only replay
            pair.run(PLAN, {})
        _linger_in_the_first_update(monkeypatch)
        errors: list[BaseException] = []
        start = threading.Barrier(len(pairs))

        def replay(pair: harness.SideBySide) -> None:
            try:
                start.wait(timeout=30)
                with torch.inference_mode():  # thread-local, as lmdeploy's engine thread sets it
                    pair.run(PLAN * ROUNDS, {})
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)

        threads = [threading.Thread(target=replay, args=(pair,)) for pair in pairs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        assert not any(thread.is_alive() for thread in threads), "a replaying thread did not finish"
        return errors, pairs


@pytest.mark.parametrize("generation", ["G1", "G5"])  # task-update and graph-update paths
def test_two_threads_replaying_refresh_their_graphs_one_at_a_time(sim_backend, generation, monkeypatch):
    before = seqlen.UPDATES.refreshes
    errors, pairs = _replays_from_two_threads(generation, monkeypatch)
    assert not errors, errors
    for pair in pairs:
        assert not pair.mismatches, pair.mismatches[:5]
        assert pair.runner.stats.replays >= len(PLAN) * ROUNDS
    assert seqlen.UPDATES.refreshes - before >= 2 * len(PLAN) * ROUNDS


@pytest.mark.parametrize("generation", ["G1", "G5"])
def test_without_the_owner_a_second_threads_update_fails(sim_backend, generation, monkeypatch):
    monkeypatch.setattr(runner, "UPDATES", contextlib.nullcontext())  # the owner removed
    errors, _ = _replays_from_two_threads(generation, monkeypatch)
    assert errors and "another thread of this process has a task update open" in str(errors[0]), errors
