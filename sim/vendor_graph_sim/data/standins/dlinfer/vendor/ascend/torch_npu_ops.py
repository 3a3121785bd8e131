"""Stand-in for ``dlinfer.vendor.ascend.torch_npu_ops``'s decode entry point (our own code).

As in dlinfer main (a50184e): the two decode functions are imported *by name* from ``.attention`` and looked
up as this module's globals by ``paged_decode_attention``, which takes every parameter positionally and
without defaults, in dlinfer's order (``q_seq_len`` before ``kv_seq_len``; ``kv_scales``, ``kv_zeros`` and
``quant_bits`` last, accepted and unused in decode), converts the block table to int32, and picks MLA when
the key and value head sizes differ. The real function is registered into dlinfer's vendor op registry;
the stand-in's ``dlinfer.ops`` imports this module when its op is called instead.
"""

import math

import torch

from .attention import decode_attention, decode_attention_mla


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
        raise RuntimeError("paged_decode_attention (dlinfer stand-in): alibi_slopes are not supported")
    if isinstance(block_table, torch.Tensor) and block_table.dtype != torch.int32:
        block_table = block_table.to(torch.int32)
    query = query.contiguous()
    attn_output = attn_output.contiguous()
    scale_value = softmax_scale if softmax_scale else 1.0 / math.sqrt(query.shape[-1])
    if key_cache.shape[-1] == value_cache.shape[-1]:
        return decode_attention(
            query=query,
            key_cache=key_cache,
            value_cache=value_cache,
            num_q_heads=num_q_heads,
            num_kv_heads=num_kv_heads,
            scale_value=scale_value,
            block_table=block_table,
            block_size=block_size,
            q_seq_len=q_seq_len,
            kv_seq_len=kv_seq_len,
            softmax_scale=softmax_scale,
            attn_output=attn_output,
        )
    return decode_attention_mla(
        query=query,
        key_cache=key_cache,
        num_kv_heads=num_kv_heads,
        num_q_heads=num_q_heads,
        scale_value=scale_value,
        block_table=block_table,
        kv_seq_len=kv_seq_len,
        mla_vheadsize=value_cache.shape[-1],
        attn_output=attn_output,
    )
