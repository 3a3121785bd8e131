"""Stand-in for ``dlinfer.vendor.camb.camb_ops``'s KV fill and decode attention (our own code).

As in dlinfer main (a50184e): ``fill_kv_cache`` takes a 1-d int32 slot index per token and a cache
``(blocks, kv_heads, block_size, head_dim)``; ``paged_decode_attention`` takes sixteen positional parameters
(``q_seq_len`` before ``kv_seq_len``, unused), needs an int32 block table, views the query as one token per
sequence and hands ``kv_seq_len`` and ``max_kv_seq_len`` to the device kernel
(``tmo.single_query_cached_kv_attn``; here the simulator's ``camb_paged_decode_attention``), which writes
``attn_output``.
"""

import math

import torch
from vendor_graph_sim import kernels


def fill_kv_cache(key, value, key_cache, value_cache, kv_indices, k_scales_zeros, v_scales_zeros, quant_bits):
    assert key.ndim == 3 and value.ndim == 3, "camb fill_kv_cache: key and value are (tokens, heads, dim)"
    assert key_cache.ndim == 4 and value_cache.ndim == 4, "camb fill_kv_cache: caches are 4-d"
    assert kv_indices.ndim == 1 and kv_indices.dtype == torch.int32, "camb fill_kv_cache: int32 (tokens,) slots"
    kernels.fill_kv_cache(key, value, key_cache, value_cache, kv_indices, "bhsd")
    return key_cache, value_cache


def paged_decode_attention(
    query,
    key_cache,
    value_cache,
    block_table,
    block_size,
    q_seq_len,
    kv_seq_len,
    max_kv_seq_len,
    num_q_heads,
    num_kv_heads,
    softmax_scale,
    alibi_slopes,
    attn_output,
    kv_scales,
    kv_zeros,
    quant_bits,
):
    assert query.ndim == 3, "camb paged_decode_attention: query is (batch, heads, dim)"
    assert block_table.ndim == 2 and block_table.dtype == torch.int32, "camb paged_decode_attention: int32 table"
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(query.shape[-1])
    out = kernels.camb_paged_decode_attention(query, key_cache, value_cache, block_table, kv_seq_len,
                                              max_kv_seq_len, softmax_scale)
    attn_output.copy_(out.reshape(attn_output.shape))
    return attn_output
