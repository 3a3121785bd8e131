"""Stand-in for ``dlinfer.vendor.ascend.attention`` (our own code; names and op calls as dlinfer's).

Function names, keyword spellings of the operator calls and the branch on the global
``AscendGraphRunner.capturing`` flag follow dlinfer-ascend 0.2.7 and dlinfer's main branch:

* ``decode_attention``: while dlinfer's flag is set, dlinfer records the call in its own bookkeeping and
  issues ``atb._npu_paged_attention`` in a task group; otherwise 0.2.7 calls
  ``atb._npu_paged_attention(..., context_lens=kv_seq_len, out=attn_output)`` and main calls the
  functional ``npu.npu_fused_infer_attention_score(..., input_layout="TND", actual_seq_lengths=q_seq_len,
  actual_seq_lengths_kv=kv_seq_len)``. The stand-in takes the main branch's kernel when ``q_seq_len`` is
  given, 0.2.7's otherwise.
* ``decode_attention_mla``: ``atb._npu_paged_attention_mla(..., context_lens=kv_seq_len,
  mla_vheadsize=..., out=attn_output)`` in both.

The kernels are whatever ``torch.ops`` holds: on CPU, ``vendor_graph_sim.kernels`` registers emulated
ones. Stand-in shapes: ``query`` (tokens, heads, dim), KV caches (blocks, block_size, kv_heads, dim).
"""

import math

import torch

from .graph_state import AscendGraphRunner, get_graph_params


def decode_attention(
    query,
    key_cache,
    value_cache,
    num_q_heads,
    num_kv_heads,
    scale_value,
    block_table,
    block_size,
    kv_seq_len,
    softmax_scale,
    attn_output,
    q_seq_len=None,
):
    if AscendGraphRunner.capturing:
        # dlinfer's own capture bookkeeping (the real one also opens a task group and an ExternalEvent).
        get_graph_params().records.append(("decode_attention", {"kv_seq_len": kv_seq_len}))
    if q_seq_len is None:
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
        return attn_output
    dim = query.shape[-1]
    blocks = key_cache.size(0)
    attn_output, _ = torch.ops.npu.npu_fused_infer_attention_score(
        query=query,
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
    if AscendGraphRunner.capturing:
        get_graph_params().records.append(("decode_attention_mla", {"kv_seq_len": kv_seq_len}))
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
    return attn_output
