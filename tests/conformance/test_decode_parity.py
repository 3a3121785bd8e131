"""Graph vs eager over many decode steps, with KV integrity, per vendor and torch_npu generation.

Sequences finish and new ones take their freed KV blocks every 8 steps. Every step checks: hidden
states bitwise equal to eager (sim), the same greedy tokens, no buffer row past the live batch that is
not padding, and every byte of every KV cache equal to the eager run's (so padding rows wrote nothing,
not even the reserved block 0), and that padding rows hold the documented inert values. Three pairs of steps
are issued back to back before anything syncs. Per configuration it also checks: graphs captured = buckets used,
and, on Ascend, that every replay refreshed the host KV lengths through the generation's path.
"""

from __future__ import annotations

import logging
import os
import random

import pytest
from vendor_graph_sim.harness import graphs_by_batch, run, schedule

from vendor_graph.sizing import buckets
from vendor_graph.upstream import compat
from vendor_graph.vendors.ascend.releases import GENERATION_FACTS

RELEASE = compat.series(compat.installed_lmdeploy_version())
STEPS = 64
NUM_SEQS = 20
SCHEDULES = int(os.environ.get("VENDOR_GRAPH_CONFORMANCE_SCHEDULES", "1"))
# VENDOR_GRAPH_CONFORMANCE_GENERATIONS: the generations the parity matrix runs (default every one with a graph
# API; the test command runs them all on the last lmdeploy release and G1 G5, one per update path, on the others).
GRAPH_GENERATIONS = os.environ.get("VENDOR_GRAPH_CONFORMANCE_GENERATIONS", "").split() or [
    g for g in GENERATION_FACTS if g != "G0"]


# Three times the next two steps are issued back to back before anything syncs (an engine keeping the next
# input on the device): step N's replay is still queued when step N+1 refreshes the captured tasks.
OVERLAPPED = {10: ("overlap_next",), 29: ("overlap_next",), 50: ("overlap_next",)}


def used_buckets(runner, plan):
    return {buckets.pad_to_bucket(runner.get_capture_batch_sizes(), len(a)) for a in plan}


@pytest.mark.parametrize("generation", GRAPH_GENERATIONS)
@pytest.mark.parametrize("attention", ["fia", "fia_v2", "paged_attention"])
def test_ascend_graph_matches_eager_and_refreshes_seqlens(sim_backend, generation, attention):
    for seed in range(SCHEDULES):
        pair = run("ascend", seed, generation=generation, attention=attention, steps=STEPS, num_seqs=NUM_SEQS,
                   events=OVERLAPPED)
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
        from vendor_graph.vendors.ascend.seqlen import ATTENTION_OPS, path_for

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


# Batches that jump across buckets and shrink within them on max_batches 64: a smaller batch replaying the
# graph a larger one just used must read padding, not the larger one's rows, in every buffer.
SHRINKING = [4, 3, 2, 1, 32, 17, 20, 64, 49, 33, 16, 9, 5, 64, 33]
# The graph each batch takes: Ascend's three tiers (powers of two to 16, multiples of 16 to 256) and
# lmdeploy's CUDA rule (powers of two to 256) that Camb and MACA keep.
ASCEND_BUCKET = {1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 9: 16, 16: 16, 17: 32, 20: 32, 32: 32, 33: 48, 49: 64, 64: 64}
CUDA_BUCKET = {**ASCEND_BUCKET, 33: 64}
REALLOCATED_AFTER = 7  # the caches move after the first batch of 64; the next step (49) replays its graph


def _shrinking_plan() -> list[list[int]]:
    rng = random.Random(0)
    return [sorted(rng.sample(range(64), n)) for n in SHRINKING]


def _shrinking_within_buckets(vendor: str, backend: str, generation: str | None = None, attention: str = "fia"):
    """Every step equals eager (hidden states, tokens, padding rows, every KV byte), each batch takes the
    graph of its documented bucket, and the KV caches moving mid-run recapture the graph that read them."""
    pair = run(vendor, 0, generation=generation, attention=attention, num_seqs=64, max_batches=64,
               plan=_shrinking_plan(), replacements={}, events={REALLOCATED_AFTER: ("realloc_kv",)},
               num_blocks=64 * 4 + 1, backend=backend)
    assert not pair.mismatches, pair.mismatches[:5]
    table = ASCEND_BUCKET if vendor == "ascend" else CUDA_BUCKET
    assert set(graphs_by_batch(pair.runner)) == {table[n] for n in SHRINKING}
    stats = pair.runner.stats
    assert {size: b.stale_recaptures for size, b in stats.buckets.items() if b.stale_recaptures} == {64: 1}
    assert stats.replays + stats.captures == len(SHRINKING)


# MLA (G5): its KV write is npu_scatter_nd_update_, where -1 padding is out of range (docs/ascend_kernel_facts.md).
@pytest.mark.parametrize("generation,attention", [("G1", "fia"), ("G5", "fia"), ("G5", "paged_attention"),
                                                  ("G5", "mla")])
def test_ascend_batches_shrinking_within_their_bucket_match_eager(sim_backend, generation, attention):
    _shrinking_within_buckets("ascend", sim_backend, generation, attention)


@pytest.mark.skipif(RELEASE not in compat.SUPPORTED_SERIES["camb"], reason=f"Camb/MACA unsupported on {RELEASE}")
@pytest.mark.parametrize("vendor", ["camb", "maca"])
def test_camb_maca_batches_shrinking_within_their_bucket_match_eager(cuda_style_backend, vendor):
    _shrinking_within_buckets(vendor, cuda_style_backend)
