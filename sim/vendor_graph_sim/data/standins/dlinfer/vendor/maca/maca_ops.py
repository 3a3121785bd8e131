"""Stand-in for ``dlinfer.vendor.maca.maca_ops``'s KV fill and decode attention (our own code).

As in dlinfer main (a50184e): ``fill_kv_cache`` squeezes the slot index's last dimension (lmdeploy's MACA
backend builds ``(tokens, 1)`` int64) and writes a cache ``(blocks, block_size, kv_heads, head_dim)``;
``paged_decode_attention`` takes sixteen positional parameters, rejects ALiBi, and hands ``kv_seq_len`` to the
device kernel as its cache lengths (``flash_attn_with_kvcache(cache_seqlens=)``; here the simulator's
``maca_paged_decode_attention``); ``max_kv_seq_len`` is not used. It returns a new tensor.
"""

import math

from vendor_graph_sim import kernels


def fill_kv_cache(key, value, key_cache, value_cache, kv_indices, k_scales_zeros, v_scales_zeros, quant_bits):
    kernels.fill_kv_cache(key, value, key_cache, value_cache, kv_indices.squeeze(-1), "bshd")
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
    if alibi_slopes is not None:
        raise RuntimeError("maca paged_decode_attention (dlinfer stand-in): alibi_slopes are not supported")
    if softmax_scale is None:
        softmax_scale = float(1 / math.sqrt(query.size(-1)))
    return kernels.maca_paged_decode_attention(query, key_cache, value_cache, block_table, kv_seq_len, softmax_scale)
