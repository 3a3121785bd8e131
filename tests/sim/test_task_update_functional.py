"""A functional attention op on the task-update path (dlinfer main's decode FIA on G1/G2a).

The re-issued task must write where the graph's later work reads: the capture scope captures the op's
``.out`` overload into preallocated outputs and hands those back as the functional call's result."""

import torch
from vendor_graph_sim import device as sim
from vendor_graph_sim import kernels  # noqa: F401 - registers the emulated ops

from vendor_graph.vendors.ascend import hook
from vendor_graph.vendors.ascend.seqlen import TASK_UPDATE, detect

HEADS, DIM, BLOCK, BLOCKS = 2, 16, 4, 6


def _fia(q, kc, vc, table, kv_lens):
    return hook.call_attention(
        torch.ops.npu.npu_fused_infer_attention_score, q, kc, vc, atten_mask=None, actual_seq_lengths=[1, 2],
        actual_seq_lengths_kv=kv_lens,
        block_table=table, num_heads=HEADS, scale=DIM ** -0.5, input_layout="TND", num_key_value_heads=HEADS,
        sparse_mode=0, block_size=BLOCK)


def test_functional_fia_is_captured_as_its_out_overload_and_refreshed_in_place():
    with sim.use_torch_npu("G1") as torch_npu:
        npu = torch.npu
        gen = torch.Generator().manual_seed(0)
        q = torch.randn(2, HEADS, DIM, generator=gen).to("npu")
        kc = torch.randn(BLOCKS, BLOCK, HEADS * DIM, generator=gen).to("npu")
        vc = torch.randn(BLOCKS, BLOCK, HEADS * DIM, generator=gen).to("npu")
        table = torch.tensor([[1, 2], [3, 4]], dtype=torch.int32).to("npu")
        caps = detect(npu, torch_npu.__version__)
        stream, update = npu.Stream(), npu.Stream()
        graph = npu.NPUGraph()
        scope = hook.CaptureScope(npu=npu, capabilities=caps, stream=stream)
        with npu.stream(stream):
            with scope, npu.graph(graph, stream=stream):
                out, lse = _fia(q, kc, vc, table, [3, 5])
                doubled = out * 2  # later graph work reads the attention output
        (task,) = scope.tasks
        assert task.path == TASK_UPDATE and task.op is torch.ops.npu.npu_fused_infer_attention_score.out
        assert task.kwargs["attention_out"] is out and task.kwargs["softmax_lse"] is lse
        for lens in ([3, 5], [4, 7], [2, 8]):
            with npu.stream(update):
                npu.graph_task_update_begin(update, task.handle)
                task.call_with(lens)
                npu.graph_task_update_end(update)
                task.event.record(update)
            graph.replay()
            expected, _ = torch.ops.npu.npu_fused_infer_attention_score(
                q, kc, vc, atten_mask=None, actual_seq_lengths=[1, 2], actual_seq_lengths_kv=lens,
                block_table=table, num_heads=HEADS, scale=DIM ** -0.5, input_layout="TND",
                num_key_value_heads=HEADS, sparse_mode=0, block_size=BLOCK)
            sim.synchronize()
            assert torch.equal(out.cpu(), expected.cpu()), lens
            assert torch.equal(doubled.cpu(), (expected * 2).cpu()), lens
