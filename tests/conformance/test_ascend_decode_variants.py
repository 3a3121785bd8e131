"""Ascend decode variants on vendor_graph's AscendGraphRunner (built by lmdeploy's patched builder):
multi-token decode (speculative decoding, a fixed ``query_len`` > 1 tokens per sequence per step) and
MLA decode (``npu_multi_head_latent_attention.out`` and ``atb::_npu_paged_attention_mla``).

Every step of every schedule checks what ``test_decode_parity`` checks (hidden states of every query
token bitwise equal to eager, the same greedy tokens, no stale buffer row past the live batch, every
KV byte equal to eager's) while the batch changes every few steps and sequences retire and hand
their blocks to new ones. Per configuration: graphs are keyed and sized by the query length, every
replay refreshed each layer's attention task, and the runner chose, per op, the seq-len update path
the generation allows:

- FIA in multi-token decode: task-update on G1 (no ``NPUGraph.update``), graph-update from G2a on
  (``.out`` is intercepted, keyword ``actual_seq_lengths_kv``); FIA v2 only from G3a on;
- MLA ``.out`` (``context_lens`` positional, index 5): graph-update from G3a on, task-update before;
- ``_npu_paged_attention_mla``: never intercepted by ``NPUGraph.update``, task-update everywhere.
"""

from __future__ import annotations

import logging

import pytest
from vendor_graph_sim.harness import run, schedule

from vendor_graph.sizing import buckets
from vendor_graph.vendors.ascend.releases import GENERATION_FACTS
from vendor_graph.vendors.ascend.seqlen import ATTENTION_OPS, GRAPH_UPDATE, TASK_UPDATE, path_for

STEPS = 24
NUM_SEQS = 6
SEED = 0
OPS = {  # attention variant -> (op, overload the tiny model calls)
    "fia": ("npu_fused_infer_attention_score", ".out"),
    "fia_v2": ("npu_fused_infer_attention_score_v2", ".out"),
    "mla": ("npu_multi_head_latent_attention", ".out"),
    "paged_attention_mla": ("_npu_paged_attention_mla", ".default"),
}


def check_pair(pair, generation: str, attention: str, query_len: int, expected_path: str) -> None:
    assert not pair.mismatches, pair.mismatches[:5]
    runner = pair.runner
    layers = pair.model.config.num_layers
    graphs = runner.graphs()
    plan = schedule(NUM_SEQS, STEPS, SEED)
    sizes = runner.get_capture_batch_sizes()
    assert {k.padded_batch for k in graphs} == {buckets.pad_to_bucket(sizes, len(a)) for a in plan}
    assert not runner.eager_reasons()
    op, overload = OPS[attention]
    # the expectation stated in the test agrees with the generation table the runner decides from
    assert path_for(GENERATION_FACTS[generation], ATTENTION_OPS[op], overload) == expected_path
    for key, graph in graphs.items():
        assert key.query_len == query_len
        assert graph.meta.decode_query_len == query_len
        assert graph.meta.max_tokens == key.padded_batch * query_len
        assert graph.meta.input_buffers["kv_start_indices"].shape == (key.padded_batch * query_len,)
        assert graph.meta.input_buffers["input_ids"].shape == (1, key.padded_batch * query_len)
        assert len(graph.tasks) == layers
        assert {t.spec.name for t in graph.tasks} == {op}
        assert graph.paths == {expected_path}, f"{key}: {graph.paths}"
    replays = runner.stats.replays
    assert replays == STEPS - len(graphs)  # each bucket's first step is its capture
    assert pair.counters["updates"] == replays * layers  # every replay refreshed every layer's task


@pytest.mark.parametrize(("generation", "attention", "query_len", "expected_path"), [
    ("G1", "fia", 2, TASK_UPDATE),
    ("G3a", "fia", 3, GRAPH_UPDATE),
    ("G5", "fia", 2, GRAPH_UPDATE),
    ("G2b", "fia_v2", 2, TASK_UPDATE),
    ("G5", "fia_v2", 3, GRAPH_UPDATE),
])
def test_multi_token_decode_matches_eager(sim_backend, generation, attention, query_len, expected_path):
    pair = run("ascend", SEED, generation=generation, attention=attention, steps=STEPS, num_seqs=NUM_SEQS,
               query_len=query_len)
    check_pair(pair, generation, attention, query_len, expected_path)
    # lmdeploy built the steps on its multi-token branch (FIA causal mask), and every draft was accepted
    for session in (pair.eager, pair.graph):
        assert session.query_len == query_len
    assert pair.eager.tokens == pair.graph.tokens


@pytest.mark.parametrize(("generation", "attention", "expected_path"), [
    ("G3a", "mla", GRAPH_UPDATE),
    ("G2b", "mla", TASK_UPDATE),
    ("G5", "mla", GRAPH_UPDATE),
    ("G1", "paged_attention_mla", TASK_UPDATE),
    ("G5", "paged_attention_mla", TASK_UPDATE),
])
def test_mla_decode_matches_eager(sim_backend, generation, attention, expected_path):
    pair = run("ascend", SEED, generation=generation, attention=attention, steps=STEPS, num_seqs=NUM_SEQS)
    check_pair(pair, generation, attention, 1, expected_path)
    k_cache, v_cache = pair.graph.kv_caches[0]
    assert k_cache.shape[-1] != v_cache.shape[-1] and k_cache.shape[-2] == 1


def test_multi_token_replays_without_the_refresh_read_stale_kv_lengths(sim_backend, monkeypatch):
    """The parity check sees a frozen ``actual_seq_lengths_kv`` in multi-token graphs (mutation check)."""
    from vendor_graph_sim import device as sim

    from vendor_graph.vendors.ascend.runner import AscendGraphRunner

    monkeypatch.setattr(AscendGraphRunner, "_refresh_seqlens", lambda self, graph, lens: None)
    # without an update the captured ExternalEvent waits would hold every replay: let them pass
    with sim.configured(external_event_blocks_replay=False):
        pair = run("ascend", SEED, generation="G5", attention="fia", steps=8, num_seqs=NUM_SEQS, query_len=2)
    assert any("hidden states differ" in m for m in pair.mismatches), pair.mismatches[:3]


def test_paged_attention_mla_forced_to_graph_update_is_recaptured_with_task_groups(sim_backend, monkeypatch,
                                                                                   caplog):
    """``NPUGraph.update`` never reaches ``_npu_paged_attention_mla`` (so an MLA graph refreshed only
    through it keeps its capture-time lengths): forced to graph-update on G5, the post-capture check
    finds no record for its tasks and the runner recaptures them with task groups."""
    monkeypatch.setenv("VENDOR_GRAPH_SEQLEN_UPDATE", "graph-update")
    with caplog.at_level(logging.WARNING, logger="vendor_graph"):
        pair = run("ascend", SEED, generation="G5", attention="paged_attention_mla", steps=9, num_seqs=NUM_SEQS)
    assert not pair.mismatches, pair.mismatches[:3]
    assert {p for g in pair.runner.graphs().values() for p in g.paths} == {TASK_UPDATE}
    assert "NPUGraph.update would reach 0 of the 2 attention tasks" in caplog.text
    assert "recapturing with task groups" in caplog.text
