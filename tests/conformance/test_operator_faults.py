"""Faults on the Ascend runner: out of memory or any error during capture (in the warmup forward, in
the graph, inside an attention task group) leaves nothing half-made, the key runs eager with a logged
reason and serving continues; a batch above the largest size runs eager with a warning; index
tensors of other integer dtypes than the buffers' are converted, not mis-read."""

from __future__ import annotations

import logging

import pytest
import torch
from vendor_graph_sim import harness

import vendor_graph.vendors.ascend.hook as hook
from vendor_graph.runtime import failures


def _fail_once(pair, monkeypatch, *, when, exc):
    """Make the model raise ``exc`` once, during a graph-session step, at the first forward for which
    ``when(n)`` holds (n counts the graph session's forwards: 0 is the warmup of the first capture)."""
    original = type(pair.model).forward
    calls = {"n": 0, "raised": 0, "graph": False}
    plain_step = pair.graph_step

    def graph_step(model, ctx):
        calls["graph"] = True
        try:
            return plain_step(model, ctx)
        finally:
            calls["graph"] = False

    def forward(self, *args, **kwargs):
        if calls["graph"]:
            n = calls["n"]
            calls["n"] += 1
            if not calls["raised"] and when(n):
                calls["raised"] += 1
                raise exc
        return original(self, *args, **kwargs)

    pair.graph_step = graph_step
    monkeypatch.setattr(type(pair.model), "forward", forward)
    return calls


@pytest.mark.parametrize("stage", ["warmup", "capture"])
@pytest.mark.parametrize("generation", ["G1", "G5"])
def test_out_of_memory_leaves_nothing_half_made(sim_backend, monkeypatch, caplog, generation, stage):
    oom = torch.OutOfMemoryError("NPU out of memory. Tried to allocate 2.00 GiB")
    with caplog.at_level(logging.ERROR, logger="vendor_graph"), harness.ascend_pair(generation) as pair:
        runner = pair.runner
        calls = _fail_once(pair, monkeypatch, exc=oom,
                           when=(lambda n: n == 0) if stage == "warmup" else (lambda n: hook.capturing()))
        pair.step([0, 1])  # bucket 2: fails, this step is served eagerly and right
        assert calls["raised"] == 1
        assert not runner.graphs() and runner._pool is None  # no graph registered, the pool released
        assert not hook.capturing()  # no capture scope left open
        (key, reason), = runner.eager_reasons().items()
        assert key.padded_batch == 2 and failures.OOM_REMEDY in reason and "OutOfMemoryError" in reason
        assert runner.stats.buckets[2].capture_failures == 1
        pair.step([0, 1])  # that key stays eager
        pair.step([0, 1, 2])  # another bucket captures and replays normally
        pair.step([0, 1, 2])
        assert [k.padded_batch for k in runner.graphs()] == [4]
        assert runner.stats.buckets[4].replays == 1
        assert runner.stats.eager_steps[reason] == 1 + (stage == "warmup")
    assert not pair.mismatches, pair.mismatches[:3]
    assert "capturing GraphKey(padded_batch=2" in caplog.text and "serving continues" in caplog.text


def test_an_error_inside_a_task_group_leaves_the_stream_usable(sim_backend, monkeypatch):
    """G1 (task-update): the attention op fails between graph_task_group_begin and _end; the capture
    is abandoned, and the next bucket's capture on the same stream works."""
    real = hook.CaptureScope.call
    state = {"raised": False}

    def call(self, op, args, kwargs):
        if not state["raised"]:
            state["raised"] = True
            self.npu.graph_task_group_begin(self.stream)
            raise RuntimeError("EZ9999: simulated kernel launch failure")
        return real(self, op, args, kwargs)

    with harness.ascend_pair("G1") as pair:
        monkeypatch.setattr(hook.CaptureScope, "call", call)
        pair.step([0, 1])
        assert not pair.runner.graphs() and state["raised"] and not hook.capturing()
        pair.step([0, 1, 2, 3])
        pair.step([0, 1, 2, 3])
        assert [k.padded_batch for k in pair.runner.graphs()] == [4]
        assert pair.runner.stats.buckets[4].replays == 1
    assert not pair.mismatches, pair.mismatches[:3]


def test_a_batch_above_the_largest_size_runs_eager_with_a_warning(sim_backend, caplog):
    with caplog.at_level(logging.WARNING, logger="vendor_graph"), \
            harness.ascend_pair("G5", num_seqs=6, max_batches=4) as pair:
        assert pair.runner.get_capture_batch_sizes()[-1] == 4
        for active in ([0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5], [0, 1, 2], [0, 1, 2, 3, 4]):
            pair.step(active)
        assert pair.runner.stats.eager_steps["batch above the largest captured size"] == 3
        assert [k.padded_batch for k in pair.runner.graphs()] == [4]
    assert not pair.mismatches, pair.mismatches[:3]
    assert caplog.text.count("above the largest captured size 4") == 1
    assert "a batch of 6 is above the largest captured size 4" in caplog.text


def _flip(t):
    if isinstance(t, torch.Tensor) and not t.is_floating_point() and t.dtype != torch.bool:
        return t.to(torch.int32 if t.dtype == torch.int64 else torch.int64)
    return t


@pytest.mark.parametrize("generation", ["G1", "G5"])
def test_index_tensors_of_the_other_int_dtype_are_converted(sim_backend, generation):
    """int64 block tables / KV lengths where int32 is declared, int32 input_ids where int64 is: the
    graph's buffers keep their declared dtypes and hold the right values (graph equals eager)."""
    flipped = set()
    with harness.ascend_pair(generation) as pair:
        plain = pair.graph_step

        def graph_step(model, ctx):
            ctx.input_ids = _flip(ctx.input_ids)
            meta = ctx.attn_metadata
            for name in ("block_offsets", "kv_seqlens", "kv_start_indices"):
                value = getattr(meta, name, None)
                if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                    setattr(meta, name, _flip(value))
                    flipped.add((name, str(value.dtype)))
            return plain(model, ctx)

        pair.graph_step = graph_step
        for active in harness.schedule(6, 12, seed=5):
            pair.step(active)
        for graph in pair.runner.graphs().values():
            buffers = graph.meta.input_buffers
            assert buffers["block_offsets"].dtype == torch.int32
            assert buffers["input_ids"].dtype == torch.int64
        assert pair.runner.stats.replays > 0
    assert ("block_offsets", "torch.int32") in flipped or ("block_offsets", "torch.int64") in flipped
    assert not pair.mismatches, pair.mismatches[:3]


def test_oom_detection():
    assert failures.is_oom(torch.OutOfMemoryError("x"))
    assert failures.is_oom(RuntimeError("NPU out of memory. Tried to allocate 20.00 MiB"))
    wrapped = RuntimeError("capture failed")
    wrapped.__cause__ = RuntimeError("CUDA out of memory")
    assert failures.is_oom(wrapped)
    assert not failures.is_oom(RuntimeError("207008 stream resources are insufficient"))


def test_a_replay_whose_inputs_changed_runs_that_step_eager(sim_backend, monkeypatch, caplog):
    """A step the graph cannot serve (its fill raises GraphInputsChanged after re-binding the step's
    metadata) runs eager on the step's own metadata, and serving continues with the graph."""
    from vendor_graph.buffers import GraphInputsChanged
    from vendor_graph.vendors.ascend import PROFILE

    bind = type(PROFILE.spec).bind_context
    refused, seen = [], set()

    def bind_refusing_one_padded_replay(self, graph_meta, context):
        live = context.q_seqlens.size(0)
        bind(self, graph_meta, context)  # attn_metadata and the context now point at the buffers
        replaying = id(graph_meta) in seen  # its first bind was the capture's
        seen.add(id(graph_meta))
        if replaying and live < graph_meta.max_batchs and not refused:
            refused.append(live)
            raise GraphInputsChanged("injected: a source appeared after capture")

    monkeypatch.setattr(type(PROFILE.spec), "bind_context", bind_refusing_one_padded_replay)
    with caplog.at_level(logging.WARNING, logger="vendor_graph"), harness.ascend_pair("G5", num_seqs=6) as pair:
        for active in ([0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2], [0, 1, 2], [0, 1, 2, 3]):
            pair.step(active)
        eager = [r for r in pair.runner.stats.eager_steps if r.startswith("inputs differ from the capture")]
    assert refused == [3]
    assert not pair.mismatches, pair.mismatches[:3]
    assert eager and pair.runner.stats.eager_steps[eager[0]] == 1
    assert "ran eager: injected" in caplog.text
