"""Replay-step cost on the simulator: one device operation for the inputs per replay step on every vendor
(plus the seq-len update on Ascend), no host wait, and ``_foreach_copy_`` as one device op, eager and
captured."""

import pytest
import torch
from vendor_graph_sim import device as sim
from vendor_graph_sim.device.opcount import replay_step_ops

from vendor_graph.buffers import BufferSpec
from vendor_graph.upstream import compat

CASES = [("ascend", "graph-update"), ("ascend", "task-update"), ("camb", None), ("maca", None)]
RELEASE = compat.series(compat.installed_lmdeploy_version())


def per_field_write(self, writes):
    """What fill used to be: a copy per field and a fill per shrunk dimension (the regression to catch)."""
    for st, src, extent, _plan in writes:
        st.tensor[tuple(slice(0, n) for n in extent)].copy_(src)
        for d, (n, hw) in enumerate(zip(extent, st.high_water, strict=True)):
            if n < hw:
                box = st.tensor.narrow(d, n, hw - n)
                box.fill_(st.pad) if st.pad_full is None else box.copy_(st.pad_full.narrow(d, n, hw - n))
        st.high_water = tuple(extent)


@pytest.mark.parametrize(("vendor", "path"), CASES, ids=[f"{v}-{p}" if p else v for v, p in CASES])
def test_a_replay_step_copies_its_inputs_once_and_never_waits_on_the_host(vendor, path):
    """Every replay step: one device operation for all batch-dependent inputs (fill and context bind
    together), one replay, nothing else outside the seq-len update, and no host wait on device work
    (synchronize, event synchronize, device-to-host read) anywhere in the runner call."""
    if RELEASE not in compat.SUPPORTED_SERIES[vendor]:
        pytest.skip(f"vendor_graph.{vendor} does not support lmdeploy {RELEASE}")
    log, mismatches = replay_step_ops(vendor, seqlen_path=path, steps=24, num_seqs=12)
    assert mismatches == []
    replays = [s for s in log if s.kind == "replay"]
    assert len(replays) >= 10
    for s in replays:
        assert s.fill + s.bind == 1, s
        assert s.replay == 1 and s.other == 0, s
        assert s.host_syncs == 0 and s.d2h == 0, s
        if path == "graph-update":
            assert s.update_calls == 1, s
        elif vendor != "ascend":
            assert s.update == 0 and s.update_calls == 0, s


def test_a_host_wait_before_the_update_is_counted(monkeypatch):
    """Where torch_npu's update stream cannot be reached the runner falls back to waiting on the host
    before NPUGraph.update: the counter sees that wait in every replay step after the first."""
    from vendor_graph.vendors.ascend import runner

    monkeypatch.setattr(runner, "graph_update_stream", lambda npu_graph: None)
    log, mismatches = replay_step_ops("ascend", seqlen_path="graph-update", steps=12, num_seqs=12)
    assert mismatches == []
    replays = [s for s in log if s.kind == "replay"]
    assert replays and sum(s.host_syncs > 0 for s in replays) >= len(replays) - 1


def test_a_per_field_fill_is_caught(monkeypatch):
    monkeypatch.setattr(BufferSpec, "_write", per_field_write)
    monkeypatch.setattr(BufferSpec, "fast_fill", False)
    log, mismatches = replay_step_ops("ascend", seqlen_path="graph-update", steps=12, num_seqs=12)
    assert mismatches == []
    replays = [s for s in log if s.kind == "replay"]
    assert replays and all(s.fill + s.bind > 2 for s in replays)


def test_foreach_copy_is_one_device_op_eager_and_in_capture():
    with sim.cuda_graph_api():
        dst = torch.zeros(6, dtype=torch.int32, device="npu")
        src = torch.arange(10, 16, device="npu")  # int64: converted into the int32 buffer
        pad = torch.full((1,), -1, dtype=torch.int32, device="npu")
        with sim.count_ops() as eager:
            torch._foreach_copy_([dst[:4], dst[4:]], [src[:4], pad.expand(2)])
        assert eager.device_ops == 1 and eager.by_op == {"_foreach_copy_.default": 1}
        assert dst.cpu().tolist() == [10, 11, 12, 13, -1, -1]

        stream, graph = torch.cuda.Stream(), torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            torch._foreach_copy_([dst[:2], dst[2:]], [src[4:], pad.expand(4)])
        assert dst.cpu().tolist() == [10, 11, 12, 13, -1, -1]  # capture executes nothing
        with sim.count_ops() as replay:
            graph.replay()
        assert replay.device_ops == 1
        assert dst.cpu().tolist() == [14, 15, -1, -1, -1, -1]


def test_foreach_copy_from_the_host_is_a_transfer_per_host_source():
    dst = torch.zeros(4, dtype=torch.int32, device="npu")
    other = torch.zeros(2, dtype=torch.int32, device="npu")
    ones = torch.ones(2, dtype=torch.int32, device="npu")
    with sim.count_ops() as c:
        torch._foreach_copy_([dst[:3], other], [torch.tensor([7, 8, 9]), ones])
    assert c.device_ops == 2 and c.h2d == 1
    assert c.by_op == {"_foreach_copy_.default": 1, "_foreach_copy_.h2d": 1}
    assert dst.cpu().tolist() == [7, 8, 9, 0] and other.cpu().tolist() == [1, 1]


def test_count_ops_by_op_holds_only_the_block():
    torch.zeros(3, device="npu")
    with sim.count_ops() as c:
        torch.ones(2, device="npu")
    assert c.by_op == {"ones": 1}


def test_a_host_source_of_a_device_buffer_is_one_pageable_transfer_here():
    """No pinned memory on the simulator: the list goes into the fill's one ``_foreach_copy_`` as a
    pageable host tensor (a blocking transfer, counted as one more op), converted to the buffer's dtype."""
    from types import SimpleNamespace

    from packaging.version import Version

    from vendor_graph.buffers import pinned_staging_available
    from vendor_graph.vendors.cuda_style import camb_spec

    assert not pinned_staging_available()
    spec = camb_spec(compat.LmdeployApi(Version("0.17.0"), frozenset(), max_q_attr="max_q_seq_len",
                                        separate_host_seqlens=False))
    meta = SimpleNamespace(max_batchs=4, max_tokens=4, num_blocks=2, device=torch.device("npu"), decode_query_len=1,
                           input_buffers=None, is_ssm=False, use_mrope=False)

    def step(batch, kv_seqlens):
        table = torch.ones(batch, 2, dtype=torch.int32, device="npu")
        attn = SimpleNamespace(block_offsets=table, kv_seqlens=kv_seqlens, block_size=16, attention_mask=[],
                               q_seqlens=torch.ones(batch, dtype=torch.int64, device="npu"),
                               q_start_loc=torch.arange(batch + 1, dtype=torch.int32, device="npu"),
                               kv_start_indices=torch.arange(batch, dtype=torch.int32, device="npu"),
                               max_q_seq_len=1, max_kv_seq_len=3)
        inputs = {"input_ids": torch.ones(1, batch, dtype=torch.int64, device="npu"),
                  "position_ids": torch.zeros(1, batch, dtype=torch.int64, device="npu")}
        return inputs, attn

    inputs, attn = step(3, torch.tensor([3, 2, 1], dtype=torch.int32, device="npu"))
    meta.input_buffers = spec.make(meta, inputs, attn)
    spec.fill(meta, inputs, attn)
    inputs, attn = step(2, [7, 9])  # a Python list: a host source
    with sim.count_ops() as c:
        spec.fill(meta, inputs, attn)
    assert c.device_ops == 2 and c.h2d == 1, c
    assert attn.kv_seqlens.dtype == torch.int32 and attn.kv_seqlens.cpu().tolist() == [7, 9, 0, 0]
    assert attn.kv_start_indices.cpu().tolist() == [0, 1, -1, -1]


@pytest.mark.parametrize("vendor", ["ascend", "camb", "maca"])
def test_the_steady_state_on_device_tensors_is_the_fast_fill(vendor, monkeypatch):
    """The fast fill takes a source whose type is the buffer's own (a device's plain tensor: the simulator's
    device tensors here): once a step's shapes were seen, the checked fill no longer runs. Three sequences
    decode for 24 steps: after the first steps only a sequence crossing into a new KV block changes a shape."""
    from vendor_graph_sim import harness

    if RELEASE not in compat.SUPPORTED_SERIES[vendor]:
        pytest.skip(f"vendor_graph.{vendor} does not support lmdeploy {RELEASE}")
    checked = []
    original = BufferSpec._fill_checked
    monkeypatch.setattr(BufferSpec, "_fill_checked", lambda self, *a: checked.append(1) or original(self, *a))
    pair = harness.run(vendor, 0, steps=24, num_seqs=3, plan=[[0, 1, 2]] * 24)
    assert pair.mismatches == []
    replays = pair.runner.stats.replays
    assert replays >= 20
    assert len(checked) <= 8, (len(checked), replays)
