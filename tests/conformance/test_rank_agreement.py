"""Two ranks on the simulator (gloo on loopback), a capture fault or a diverging shadow check on one rank
only: both ranks take the same path for that key from then on (eager on both), the other keys capture
and replay on both, and every step on both ranks equals eager; each rank logs the runner it built, with
its rank. With the agreement removed the ranks part ways: one replays the graph while the other runs
eagerly, which in a tensor-parallel engine mismatches their collectives."""

from __future__ import annotations

import textwrap

import pytest
from once_per_run import newest_release_only

pytestmark = newest_release_only  # the agreement does not depend on lmdeploy (two processes each)

RANK_SCRIPT = textwrap.dedent("""
    import datetime, json, sys

    import torch.distributed as dist

    rank, world, port, out, agreement, fault = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4],
                                                sys.argv[5], sys.argv[6])
    if fault == "shadow":
        import os

        os.environ["VENDOR_GRAPH_SHADOW"] = "1"  # every replay is checked against eager
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    from vendor_graph_sim import device as sim
    from vendor_graph_sim import harness, standins

    standins.use_standin_dlinfer_if_missing()
    sim.install()
    from vendor_graph.runtime import failures
    from vendor_graph.vendors.ascend import hook

    import logging

    built = []
    handler = logging.Handler()
    handler.emit = lambda record: built.append(record.getMessage()) if "graph runner built" in record.getMessage() \
        else None
    logging.getLogger("vendor_graph").addHandler(handler)
    logging.getLogger("vendor_graph").setLevel(logging.INFO)
    if agreement == "off":
        failures.peers_failed = lambda ok: []  # the agreement removed
    PLAN = [[0, 1], [0, 1], [0, 1, 2, 3], [0, 1, 2, 3], [0, 1], [0, 1, 2, 3]]
    if fault == "shadow":
        PLAN = [[0, 1, 2]] * 4 + [[0, 1]] * 2
    paths = []
    with harness.ascend_pair("G5", num_seqs=6) as pair:
        if fault == "capture":
            model_cls = type(pair.model)
            forward = model_cls.forward
            raised = []

            def failing_forward(self, *args, **kwargs):
                if rank == 1 and hook.capturing() and not raised:  # rank 1's first capture (bucket 2) only
                    raised.append(1)
                    raise RuntimeError("injected: capture fault on rank 1")
                return forward(self, *args, **kwargs)

            model_cls.forward = failing_forward
        elif rank == 1:  # rank 1's graph goes wrong: every seq-len update re-sends the first lengths it saw
            refresh, frozen = pair.runner._refresh_seqlens, {}
            pair.runner._refresh_seqlens = lambda graph, lens: refresh(graph, frozen.setdefault(graph.key, lens))
        for active in PLAN:
            stats = pair.runner.stats
            before = (stats.replays, sum(stats.eager_steps.values()), stats.captures,
                      sum(b.capture_failures for b in stats.buckets.values()))
            pair.step(active)
            stats = pair.runner.stats
            after = (stats.replays, sum(stats.eager_steps.values()), stats.captures,
                     sum(b.capture_failures for b in stats.buckets.values()))
            names = ("replay", "eager", "capture", "capture failed")
            changed = [name for name, b, a in zip(names, before, after) if a != b]
            paths.append(changed[0] if changed else "captured, then released")
        reasons = {str(k.padded_batch): r for k, r in pair.runner.eager_reasons().items()}
        result = dict(built=built, paths=paths, eager_reasons=reasons, mismatches=pair.mismatches[:3],
                      graphs=sorted(k.padded_batch for k in pair.runner.graphs()))
    dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(result, f)
""")


def test_a_capture_fault_on_one_rank_sends_that_key_eager_on_every_rank(sim_backend, gloo_ranks):
    pytest.importorskip("lmdeploy", reason="the ranks run lmdeploy's Ascend graph runner builder")
    rank0, rank1 = gloo_ranks(RANK_SCRIPT, 2, "on", "capture")
    assert rank0["paths"] == ["captured, then released", "eager", "capture", "replay", "eager", "replay"]
    assert rank1["paths"] == ["capture failed", "eager", "capture", "replay", "eager", "replay"]
    assert rank0["graphs"] == rank1["graphs"] == [4]
    assert "capture failed on rank(s) [1]" in rank0["eager_reasons"]["2"]
    assert "injected: capture fault on rank 1" in rank1["eager_reasons"]["2"]
    assert not rank0["mismatches"] and not rank1["mismatches"]
    for rank, result in enumerate((rank0, rank1)):  # one line per rank, from the runner the rank built
        assert len(result["built"]) == 1 and f"built on rank {rank} of 2" in result["built"][0]
        assert "patches in place" in result["built"][0]


def test_without_the_agreement_the_ranks_part_ways(sim_backend, gloo_ranks):
    pytest.importorskip("lmdeploy", reason="the ranks run lmdeploy's Ascend graph runner builder")
    rank0, rank1 = gloo_ranks(RANK_SCRIPT, 2, "off", "capture")
    assert rank0["paths"][1] == "replay" and rank1["paths"][1] == "eager"
    assert rank0["graphs"] == [2, 4] and rank1["graphs"] == [4]


def test_a_shadow_check_diverging_on_one_rank_sends_that_key_eager_on_every_rank(sim_backend, gloo_ranks):
    """VENDOR_GRAPH_SHADOW=1, rank 1's graph re-sends stale KV lengths: its second checked replay diverges."""
    pytest.importorskip("lmdeploy", reason="the ranks run lmdeploy's Ascend graph runner builder")
    rank0, rank1 = gloo_ranks(RANK_SCRIPT, 2, "on", "shadow")
    assert rank0["paths"] == rank1["paths"] == ["capture", "replay", "replay", "eager", "capture", "replay"]
    assert "differed from eager on rank(s) [1]" in rank0["eager_reasons"]["4"]
    assert "shadow check: graph differed from eager" in rank1["eager_reasons"]["4"]
    assert rank0["graphs"] == rank1["graphs"] == [2]
    assert not rank0["mismatches"] and not rank1["mismatches"]  # the diverged replay was answered eagerly
    rank0, rank1 = gloo_ranks(RANK_SCRIPT, 2, "off", "shadow")
    assert rank0["paths"][3] == "replay" and rank1["paths"][3] == "eager"
