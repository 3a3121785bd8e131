"""AscendGraphRunner behaviours beyond parity: the overlap guard, forced and fallback paths, several
runners in one process, reset and recapture, capture failures."""

from __future__ import annotations

import logging

import pytest
import torch
from vendor_graph_sim import harness
from vendor_graph_sim import tiny_model as tm

import vendor_graph
import vendor_graph.vendors.ascend.hook


@pytest.mark.parametrize("generation", ["G1", "G5"])  # task-update and graph-update paths
def test_the_next_refresh_waits_for_the_previous_replay(sim_backend, generation):
    """Lazy streams: step N's replay is still queued when step N+1 refreshes the captured tasks. The
    fence keeps N's replay on N's lengths; without it, N would read N+1's."""
    from vendor_graph_sim import device as sim

    with harness.ascend_pair(generation) as pair:
        batch = [0, 1, 2, 3]
        pair.step(batch)  # capture
        pair.step(batch)
        ref_n = tm.eager_step(pair.model, pair.eager.decode_context(batch))
        # Both steps' metadata is built first (lmdeploy's update_step_context reads device data on the
        # host, which would drain the queues); then the two steps are issued back to back, as an
        # engine that overlaps host and device work would, and only then does anything sync.
        ctx_n = pair.graph.decode_context(batch)
        for i in batch:
            pair.graph.tokens[i].append(1)
        ctx_n1 = pair.graph.decode_context(batch)
        with sim.configured(eager_drain=False):
            out_n = pair.graph_step(pair.model, ctx_n).clone()  # queued after replay N
            pair.graph_step(pair.model, ctx_n1)
            torch.npu.synchronize()
        assert torch.equal(out_n.cpu()[:, :4], ref_n.cpu()[:, :4])


def test_forced_task_update_is_honoured(sim_backend, monkeypatch):
    monkeypatch.setenv("VENDOR_GRAPH_SEQLEN_UPDATE", "task-update")
    with harness.ascend_pair("G5") as pair:
        for active in harness.schedule(6, 12, seed=3):
            pair.step(active)
    assert not pair.mismatches
    assert {p for g in pair.runner.graphs().values() for p in g.paths} == {"task-update"}


def test_an_update_that_misses_its_tasks_is_recaptured_with_task_groups(sim_backend, monkeypatch, caplog):
    """Forcing graph-update on G1 (no update()): the post-capture check finds no records and falls back."""
    monkeypatch.setenv("VENDOR_GRAPH_SEQLEN_UPDATE", "graph-update")
    with caplog.at_level(logging.WARNING, logger="vendor_graph"), harness.ascend_pair("G1") as pair:
        for active in harness.schedule(6, 9, seed=4):
            pair.step(active)
    assert not pair.mismatches
    assert {p for g in pair.runner.graphs().values() for p in g.paths} == {"task-update"}
    assert "NPUGraph.update would reach no of the 2 attention tasks" in caplog.text
    assert "recapturing with task groups" in caplog.text


def test_two_runners_in_one_process_own_their_pools_and_tasks(sim_backend):
    with harness.ascend_pair("G5", num_seqs=4) as target:
        draft = harness._build_runner("ascend", target.model, harness.lmdeploy_configs("ascend", target.model, 4),
                                      target.model.ctx_mgr)
        target.step([0, 1, 2])
        ctx = target.graph.decode_context([0, 1, 2])
        ctx.enable_microbatch = False
        draft(**tm.forward_kwargs(ctx))  # the draft model's runner captures its own graph
        (key, g_target), = target.runner.graphs().items()
        (key_d, g_draft), = draft.graphs().items()
        assert key == key_d and g_target.graph is not g_draft.graph
        assert target.runner._pool is not draft._pool
        assert not {id(t) for t in g_target.tasks} & {id(t) for t in g_draft.tasks}
        target.step([0, 1, 2])
    assert not target.mismatches


def test_reset_frees_everything_and_a_later_step_recaptures(sim_backend):
    with harness.ascend_pair("G3b") as pair:
        for active in ([0, 1], [0, 1], [0, 1, 2, 3, 4]):
            pair.step(active)
        assert len(pair.runner.graphs()) == 2
        pair.runner.reset()
        pair.runner.reset()  # idempotent
        assert not pair.runner.graphs() and pair.runner._pool is None
        for active in ([0, 1], [0, 1], [2, 3]):
            pair.step(active)
        assert len(pair.runner.graphs()) == 1
    assert not pair.mismatches


def test_a_capture_that_fails_leaves_no_graph_and_serving_continues(sim_backend, caplog):
    """A model forward that syncs during capture (a host read of a device tensor) cannot be captured:
    that key runs eager with its reason logged, the step's result is right, serving continues."""
    with harness.ascend_pair("G5") as pair:
        original = pair.model.forward

        def syncing_forward(*args, **kwargs):
            out = original(*args, **kwargs)
            if vendor_graph.vendors.ascend.hook.capturing():
                float(out.sum())
            return out

        pair.model.forward = syncing_forward
        with caplog.at_level(logging.ERROR, logger="vendor_graph"):
            for _ in range(3):
                pair.step([0, 1])
        del pair.model.forward
        assert not pair.runner.graphs()
        (reason,) = pair.runner.eager_reasons().values()
        assert reason.startswith("capture failed: SimCaptureError")
        assert "capturing GraphKey(padded_batch=2" in caplog.text
        pair.step([0, 1, 2, 3])  # another bucket captures normally
        assert len(pair.runner.graphs()) == 1
    assert not pair.mismatches


def test_warmup_captures_every_size_largest_first_into_one_pool(sim_backend):
    """lmdeploy's ModelAgent.warmup calls the runner once per capture size, largest first: every size
    gets its graph, all in the runner's one pool, and later steps replay them."""
    from vendor_graph_sim import device as sim

    with harness.ascend_pair("G4", num_seqs=6) as pair:
        sizes = pair.runner.get_capture_batch_sizes()
        assert sizes == [1, 2, 4, 6]
        for size in reversed(sizes):
            pair.step(list(range(size)))
        graphs = pair.runner.graphs()
        assert sorted(k.padded_batch for k in graphs) == sizes
        pools = {sim.pool_of(g.graph.pool()) for g in graphs.values()}
        assert len(pools) == 1 and pair.runner.stats.replays == 0
        for size in (3, 5, 1):
            pair.step(list(range(size)))
        assert pair.runner.stats.replays == 3 and len(pair.runner.graphs()) == len(sizes)
    assert not pair.mismatches


def test_capture_sizes_beyond_the_event_budget_are_dropped_smallest_first(sim_backend, monkeypatch, caplog):
    """2 attention layers hold 2 ExternalEvents per graph: a budget of 4 keeps the two largest sizes;
    smaller batches pad up into them, none runs eager, and the warning names what was dropped."""
    monkeypatch.setenv("VENDOR_GRAPH_NPU_EVENT_BUDGET", "4")
    with caplog.at_level(logging.WARNING, logger="vendor_graph"), harness.ascend_pair("G5", num_seqs=6) as pair:
        assert pair.runner.get_capture_batch_sizes() == [4, 6]
        for active in ([0], [0, 1, 2], [0, 1, 2, 3, 4], [1]):
            pair.step(active)
        assert sorted(k.padded_batch for k in pair.runner.graphs()) == [4, 6]
        assert not pair.runner.stats.eager_steps
    assert not pair.mismatches
    assert "Dropped capture sizes [1, 2]; kept [4, 6]" in caplog.text
