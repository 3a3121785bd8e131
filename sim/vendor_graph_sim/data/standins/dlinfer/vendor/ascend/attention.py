"""Stand-in for ``dlinfer.vendor.ascend.attention`` (our own code; signatures, op calls and branches as dlinfer
main a50184e's).

The capture state is dlinfer's, imported from ``dlinfer.framework.lmdeploy_ext.cudagraph.ascend_cudagraph`` as
the real module does (so importing this module reassigns lmdeploy's ``CudaGraphMixin`` methods, as it does
on an NPU):

* ``decode_attention(..., block_size, q_seq_len, kv_seq_len, softmax_scale, attn_output)``: while dlinfer's
  ``AscendGraphRunner.capturing`` is set and torch_npu is older than 2.8.0.post1, it waits on and resets an
  ``ExternalEvent``, records the event and the call's arguments into dlinfer's graph params (keyed by the
  token count), and issues ``atb._npu_paged_attention(..., context_lens=kv_seq_len, out=attn_output)`` in a
  task group (``graph_task_group_begin/end``), recording the handle. Otherwise, always the functional
  ``npu.npu_fused_infer_attention_score(..., input_layout="TND", actual_seq_lengths=q_seq_len,
  actual_seq_lengths_kv=kv_seq_len)`` on the caches viewed (blocks, block_size, kv_heads*dim); it returns
  that op's fresh output, not ``attn_output``.
* ``decode_attention_mla``: ``atb._npu_paged_attention_mla(..., context_lens=kv_seq_len, mla_vheadsize=...,
  out=attn_output)``; under dlinfer's flag (any torch_npu) inside the same event/task-group bookkeeping.

The kernels are whatever ``torch.ops`` holds: on CPU, ``vendor_graph_sim.kernels`` registers emulated
ones. Shapes: ``query`` (tokens, heads, dim), KV caches (blocks, block_size, kv_heads, dim).
"""

import math

import torch

from dlinfer.framework.lmdeploy_ext.cudagraph.ascend_cudagraph import (
    AscendGraphRunner,
    aclgraph_use_torch_npu_update,
    get_graph_params,
)


def _task_group(num_tokens, params, is_mla, issue):
    """dlinfer's own capture of one attention call: event, recorded arguments, task group, handle."""
    graph_params = get_graph_params()
    stream = torch.npu.current_stream()
    event = torch.npu.ExternalEvent()
    event.wait(stream)
    event.reset(stream)
    graph_params.events[num_tokens].append(event)
    graph_params.attn_params[num_tokens].append(params)
    graph_params.is_mla = is_mla
    torch.npu.graph_task_group_begin(stream)
    issue()
    graph_params.handles[num_tokens].append(torch.npu.graph_task_group_end(stream))


def decode_attention(
    query,
    key_cache,
    value_cache,
    num_q_heads,
    num_kv_heads,
    scale_value,
    block_table,
    block_size,
    q_seq_len,
    kv_seq_len,
    softmax_scale,
    attn_output,
):
    if AscendGraphRunner.capturing and not aclgraph_use_torch_npu_update():
        def issue():
            torch.ops.atb._npu_paged_attention(
                query=query,
                key_cache=key_cache,
                value_cache=value_cache,
                num_kv_heads=num_kv_heads,
                num_heads=num_q_heads,
                scale_value=scale_value,
                block_table=block_table,
                context_lens=kv_seq_len,
                out=attn_output,
            )

        params = (query, key_cache, value_cache, num_kv_heads, num_q_heads, scale_value, block_table,
                  kv_seq_len, attn_output)
        _task_group(query.shape[0], params, False, issue)
        return attn_output
    dim = query.shape[-1]
    blocks = key_cache.size(0)
    attn_output, _ = torch.ops.npu.npu_fused_infer_attention_score(
        query=query.contiguous(),
        key=key_cache.view(blocks, block_size, -1),
        value=value_cache.view(blocks, block_size, -1),
        atten_mask=None,
        block_table=block_table,
        input_layout="TND",
        block_size=block_size,
        actual_seq_lengths=q_seq_len,
        actual_seq_lengths_kv=kv_seq_len,
        num_key_value_heads=num_kv_heads,
        num_heads=num_q_heads,
        scale=softmax_scale if softmax_scale else 1.0 / math.sqrt(dim),
        sparse_mode=0,
    )
    return attn_output


def decode_attention_mla(
    query,
    key_cache,
    num_kv_heads,
    num_q_heads,
    scale_value,
    block_table,
    kv_seq_len,
    mla_vheadsize,
    attn_output,
):
    def issue():
        torch.ops.atb._npu_paged_attention_mla(
            query=query,
            key_cache=key_cache,
            num_kv_heads=num_kv_heads,
            num_heads=num_q_heads,
            scale_value=scale_value,
            block_table=block_table,
            context_lens=kv_seq_len,
            mla_vheadsize=mla_vheadsize,
            out=attn_output,
        )

    if AscendGraphRunner.capturing:
        params = (query, key_cache, num_kv_heads, num_q_heads, scale_value, block_table, kv_seq_len,
                  mla_vheadsize, attn_output)
        _task_group(query.shape[0], params, True, issue)
    else:
        issue()
    return attn_output
