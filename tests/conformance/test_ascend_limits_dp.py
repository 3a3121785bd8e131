"""Ascend capture limits (event budget, ACL error remedies) and DP agreement on the graph key.

No simulator here: the limits are pure functions, and the DP test runs the real runner's key and
update_inputs logic in two gloo processes on loopback.
"""

import json
import os
import textwrap

import pytest

from vendor_graph.config import settings
from vendor_graph.vendors.ascend import limits
from vendor_graph.vendors.ascend.seqlen import GRAPH_UPDATE, NO_UPDATE, TASK_UPDATE

ASCEND_SIZES_64 = [1, 2, 4, 8, 16, 32, 48, 64]


# -- event budget ---------------------------------------------------------------------------------------


def test_events_per_graph_counts_event_holding_tasks():
    assert limits.events_per_graph(32, TASK_UPDATE) == 32
    assert limits.events_per_graph(32, GRAPH_UPDATE) == 32
    assert limits.events_per_graph(32, NO_UPDATE) == 0
    assert limits.events_per_graph(10, [GRAPH_UPDATE, TASK_UPDATE]) == 20  # two attention ops per layer
    assert limits.events_per_graph(10, {"npu_fused_infer_attention_score": GRAPH_UPDATE,
                                        "_npu_paged_attention_mla": TASK_UPDATE}) == 20
    with pytest.raises(ValueError, match="unknown seq-len update path"):
        limits.events_per_graph(1, "graph_update")


def test_everything_fits_within_the_budget():
    result = limits.fit_capture_sizes(32, ASCEND_SIZES_64, TASK_UPDATE, budget=32 * 8)
    assert result.kept == ASCEND_SIZES_64 and result.dropped == [] and result.fits
    assert result.needed == 256 and result.message is None


def test_sizes_are_dropped_smallest_first_and_max_batches_kept():
    result = limits.fit_capture_sizes(40, ASCEND_SIZES_64, GRAPH_UPDATE, budget=40 * 3 + 39)
    assert result.kept == [32, 48, 64]
    assert result.dropped == [1, 2, 4, 8, 16]
    assert result.kept[-1] == 64  # max_batches
    msg = result.message
    assert "[1, 2, 4, 8, 16]" in msg and "207008" in msg and limits.EVENT_BUDGET_ENV in msg
    assert "max_batch_size" in msg and "cudagraph_capture_batch_sizes" in msg
    assert "pad to 32" in msg


def test_budget_for_one_graph_keeps_max_batches_only():
    result = limits.fit_capture_sizes(61, ASCEND_SIZES_64, TASK_UPDATE, budget=61)
    assert result.kept == [64]


def test_nothing_fits():
    result = limits.fit_capture_sizes(100, ASCEND_SIZES_64, TASK_UPDATE, budget=99)
    assert result.kept == [] and result.dropped == ASCEND_SIZES_64
    assert "every decode step runs eager" in result.message


def test_graphs_per_size_multiplies_the_need():
    result = limits.fit_capture_sizes(10, [1, 2, 4], TASK_UPDATE, graphs_per_size=2, budget=45)
    assert result.per_graph == 20 and result.kept == [2, 4]


def test_no_event_paths_never_drop():
    assert limits.fit_capture_sizes(500, ASCEND_SIZES_64, NO_UPDATE, budget=1).kept == ASCEND_SIZES_64


def test_budget_from_the_environment(monkeypatch):
    monkeypatch.delenv(limits.EVENT_BUDGET_ENV, raising=False)
    settings.load()  # as activation and every runner build do
    assert limits.event_budget() == limits.DEFAULT_EVENT_BUDGET
    monkeypatch.setenv(limits.EVENT_BUDGET_ENV, "100")
    settings.load()
    assert limits.event_budget() == 100
    assert limits.fit_capture_sizes(50, ASCEND_SIZES_64).kept == [48, 64]
    for off in ("0", "off"):
        monkeypatch.setenv(limits.EVENT_BUDGET_ENV, off)
        settings.load()
        assert limits.event_budget() is None
        assert limits.fit_capture_sizes(10_000, ASCEND_SIZES_64).kept == ASCEND_SIZES_64
    monkeypatch.setenv(limits.EVENT_BUDGET_ENV, "lots")
    with pytest.raises(ValueError, match=limits.EVENT_BUDGET_ENV):
        settings.load()
    with pytest.raises(ValueError, match=limits.EVENT_BUDGET_ENV):
        limits.event_budget(os.environ)


# -- ACL capture errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("message, code, remedy", [
    ("EZ9999: Inner Error! ... error code is 207008", 207008, "max_batch_size"),
    ("rtStreamCreate failed: Stream resources are insufficient", 207008, limits.EVENT_BUDGET_ENV),
    ("ACL error 207005: alloc sq cq fail", 207005, "25.5.1"),
    ("rtMemcpy failed, error code 107030", 107030, "synchronous"),
    ("the current capture mode does not support this operation", 107030, "capture"),
    ("AclmdlRICaptureEnd failed, ret 107033", 107033, "eager_mode=True"),
])
def test_known_capture_errors_are_explained(message, code, remedy):
    text = limits.explain_capture_error(RuntimeError(message))
    assert text is not None and text.startswith(f"ACL error {code}")
    assert remedy in text


def test_error_found_in_the_cause_chain():
    try:
        try:
            raise RuntimeError("error code is 207005")
        except RuntimeError as inner:
            raise ValueError("capture failed") from inner
    except ValueError as outer:
        assert limits.explain_capture_error(outer).startswith("ACL error 207005")


def test_unknown_errors_and_lookalike_numbers_are_not_explained():
    assert limits.explain_capture_error(RuntimeError("out of memory")) is None
    assert limits.explain_capture_error(RuntimeError("tensor of 12070080 elements")) is None


# -- DP: every rank picks the same graph ----------------------------------------------------------------

RANK_SCRIPT = textwrap.dedent("""
    import json, sys
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist
    from lmdeploy.pytorch.model_inputs import DPMeta

    from vendor_graph.vendors.ascend.runner import AscendGraphRunner

    rank, world, port, out, batches = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=__import__("datetime").timedelta(seconds=60))

    context = SimpleNamespace(global_is_decoding=lambda: True, enable_microbatch=False)
    model = SimpleNamespace(ctx_mgr=SimpleNamespace(current_context=lambda: context),
                            support_cuda_graph=lambda **kw: True)
    cache_config = SimpleNamespace(num_gpu_blocks=64, max_batches=64, cudagraph_capture_batch_sizes=None)
    runner = AscendGraphRunner(model, SimpleNamespace(), cache_config, SimpleNamespace(eager_mode=False), "cpu")

    results = {}
    for query_len in (1, 2):  # plain decode, and one speculative token
        batch = json.loads(batches)[rank]
        tokens = batch * query_len
        # lmdeploy's model agent: gather every rank's token count, pad to the max (spec: per query)
        num_tokens = torch.tensor([tokens])
        dist.all_reduce(num_tokens, op=dist.ReduceOp.MAX)
        padding = int(num_tokens.item()) // query_len
        inputs = dict(input_ids=torch.zeros(1, tokens, dtype=torch.long),
                      attn_metadata=SimpleNamespace(block_offsets=torch.zeros(batch, 4, dtype=torch.int32)))

        runner.get_meta().padding_batch_size = None  # what a runner keyed on the local batch would pick
        local = runner.get_graph_key(**inputs)
        runner.get_meta().padding_batch_size = padding
        key = runner.get_graph_key(**inputs)
        step = SimpleNamespace(dp_meta=DPMeta(tp_sizes=[tokens], moe_tp_sizes=[tokens]),
                               global_is_decoding=lambda: True, seq_length=torch.ones(batch, dtype=torch.long),
                               input_ids=inputs["input_ids"])
        runner.update_inputs(step)

        keys = [None] * world
        dist.all_gather_object(keys, key.as_lmdeploy_tuple())
        local_keys = [None] * world
        dist.all_gather_object(local_keys, local.as_lmdeploy_tuple())
        results[query_len] = dict(padding=padding, key=list(key.as_lmdeploy_tuple()), all_keys=keys,
                                  local_keys=local_keys, tp_sizes=step.dp_meta.tp_sizes,
                                  moe_tp_sizes=step.dp_meta.moe_tp_sizes)
    dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(results, f)
""")


def test_dp_ranks_with_different_batches_pick_the_same_graph(gloo_ranks):
    pytest.importorskip("lmdeploy", reason="the DP test runs lmdeploy's DPMeta and GraphRunner")
    batches = [3, 17]  # buckets 4 and 32: a runner keyed on the local batch would disagree
    results = gloo_ranks(RANK_SCRIPT, len(batches), json.dumps(batches))

    for query_len, bucket in (("1", 32), ("2", 32)):
        q = int(query_len)
        per_rank = [r[query_len] for r in results]
        assert all(r["padding"] == max(batches) for r in per_rank)
        keys = {tuple(k) for r in per_rank for k in r["all_keys"]}
        assert keys == {(bucket, True, False, q)}, keys  # one GraphKey on every rank
        assert per_rank[0]["key"] == per_rank[1]["key"] == [bucket, True, False, q]
        # the negative control: keyed on the local batch, the ranks would have disagreed
        assert len({tuple(k) for k in per_rank[0]["local_keys"]}) == len(batches)
        # update_inputs: the MoE/MLP token split is the padded graph's token count on every rank
        for r in per_rank:
            assert r["tp_sizes"] == [bucket * q] and r["moe_tp_sizes"] == [bucket * q]


def test_a_budget_no_graph_fits_is_the_reason_every_step_runs_eager(monkeypatch):
    from types import SimpleNamespace

    import torch

    from vendor_graph.config import settings
    from vendor_graph.vendors.ascend.runner import AscendGraphRunner

    monkeypatch.setenv("VENDOR_GRAPH_NPU_EVENT_BUDGET", "1")
    settings.load()
    context = SimpleNamespace(global_is_decoding=lambda: True, enable_microbatch=False)

    class Model:
        ctx_mgr = SimpleNamespace(current_context=lambda: context)

        def support_cuda_graph(self, **kwargs):
            return True

        def __call__(self, **kwargs):
            return torch.zeros(1, kwargs["input_ids"].size(-1), 4)

        def make_output_buffers(self, output):
            return {"hidden_states": output}

    cache_config = SimpleNamespace(num_gpu_blocks=8, max_batches=4, cudagraph_capture_batch_sizes=None)
    runner = AscendGraphRunner(Model(), SimpleNamespace(num_layers=2), cache_config,
                               SimpleNamespace(eager_mode=False), "cpu")
    out = runner(input_ids=torch.zeros(1, 3, dtype=torch.long),
                 attn_metadata=SimpleNamespace(block_offsets=torch.zeros(3, 2, dtype=torch.int32)))
    assert out["hidden_states"].shape == (1, 3, 4)
    assert runner.stats.eager_steps == {
        "VENDOR_GRAPH_NPU_EVENT_BUDGET=1: not even one decode graph fits (each needs 2 ExternalEvents); raise it "
        "to 2 or more, or set it to 0 for no limit": 1}
