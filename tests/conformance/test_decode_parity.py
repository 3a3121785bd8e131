"""Graph vs eager over many decode steps, with KV integrity, per vendor and torch_npu generation.

Sequences finish and new ones take their freed KV blocks every 8 steps. Every step checks: hidden
states bitwise equal to eager (sim), the same greedy tokens, no buffer row past the live batch that is
not padding, and every byte of every KV cache equal to the eager run's (so padding rows wrote nothing,
not even the reserved block 0). Per configuration it also checks: graphs captured = buckets used,
and, on Ascend, that every replay refreshed the host KV lengths through the generation's path.
"""

from __future__ import annotations

import logging
import os

import pytest
from vendor_graph_sim.harness import run, schedule

from vendor_graph import buckets, compat
from vendor_graph.ascend.releases import GENERATION_FACTS

RELEASE = compat.series(compat.installed_lmdeploy_version())
STEPS = 64
NUM_SEQS = 20
SCHEDULES = int(os.environ.get("VENDOR_GRAPH_CONFORMANCE_SCHEDULES", "1"))
GRAPH_GENERATIONS = [g for g in GENERATION_FACTS if g != "G0"]


def used_buckets(runner, plan):
    return {buckets.pad_to_bucket(runner.get_capture_batch_sizes(), len(a)) for a in plan}


@pytest.mark.parametrize("generation", GRAPH_GENERATIONS)
@pytest.mark.parametrize("attention", ["fia", "fia_v2", "paged_attention"])
def test_ascend_graph_matches_eager_and_refreshes_seqlens(sim_backend, generation, attention):
    for seed in range(SCHEDULES):
        pair = run("ascend", seed, generation=generation, attention=attention, steps=STEPS, num_seqs=NUM_SEQS)
        assert not pair.mismatches, pair.mismatches[:5]
        runner = pair.runner
        plan = schedule(NUM_SEQS, STEPS, seed)
        graphs = runner.graphs()
        assert {k.padded_batch for k in graphs} == used_buckets(runner, plan)
        assert not runner.eager_reasons()
        for graph in graphs.values():
            assert graph.tasks, "no attention task registered"
            assert len(graph.tasks) == pair.model.config.num_layers
        replays = runner.stats.replays
        assert replays == STEPS - len(graphs)  # each bucket's first step is its capture
        # every replay re-issued each layer's attention task with that step's host KV lengths
        assert pair.counters["updates"] == replays * pair.model.config.num_layers
        paths = {p for g in graphs.values() for p in g.paths}
        from vendor_graph.ascend.seqlen import ATTENTION_OPS, path_for

        op = {"fia": "npu_fused_infer_attention_score", "fia_v2": "npu_fused_infer_attention_score_v2",
              "paged_attention": "_npu_paged_attention"}[attention]
        overload = ".default" if attention == "paged_attention" else ".out"
        assert paths == {path_for(GENERATION_FACTS[generation], ATTENTION_OPS[op], overload)}


@pytest.mark.parametrize("attention", ["fia", "paged_attention"])
def test_ascend_on_a_real_npu_matches_eager(ascend_backend, attention):
    """The installed torch_npu's NPUGraph and attention ops (the simulator runs every generation above)."""
    if ascend_backend != "npu":
        pytest.skip("real NPU only (--graph-backend npu)")
    pair = run("ascend", 0, attention=attention, steps=STEPS, num_seqs=NUM_SEQS, backend="npu")
    assert not pair.mismatches, pair.mismatches[:5]
    assert pair.runner.graphs() and not pair.runner.eager_reasons()


def test_ascend_g0_runs_eager_with_one_clear_message(sim_backend, caplog):
    with caplog.at_level(logging.WARNING, logger="vendor_graph"):
        pair = run("ascend", 0, generation="G0", steps=8, num_seqs=4)
    assert not pair.mismatches
    assert not pair.runner.graphs()
    messages = [r.getMessage() for r in caplog.records if "has no NPUGraph API" in r.getMessage()]
    assert messages and "upgrade torch_npu for graph mode" in messages[0]
    assert len(set(messages)) <= len(pair.runner.eager_reasons())


@pytest.mark.skipif(RELEASE not in compat.SUPPORTED_SERIES["camb"], reason=f"Camb/MACA unsupported on {RELEASE}")
@pytest.mark.parametrize("vendor", ["camb", "maca"])
def test_camb_maca_on_lmdeploys_cuda_runner_match_eager(cuda_style_backend, vendor):
    for seed in range(SCHEDULES):
        pair = run(vendor, seed, steps=STEPS, num_seqs=NUM_SEQS, backend=cuda_style_backend)
        assert not pair.mismatches, pair.mismatches[:5]
        plan = schedule(NUM_SEQS, STEPS, seed)
        sizes = pair.runner.get_capture_batch_sizes()
        runners = compat.cuda_runner_graphs(pair.runner)
        used = {buckets.pad_to_bucket(sizes, len(a)) for a in plan}
        assert {k[0] for k in runners} == used
        # lmdeploy's runner, adopted: every decode step was a capture or a replay, none ran eager
        assert pair.runner.stats.replays == STEPS - len(used)
        assert sum(b.captures for b in pair.runner.stats.buckets.values()) == len(used)
        assert not pair.runner.eager_reasons()
