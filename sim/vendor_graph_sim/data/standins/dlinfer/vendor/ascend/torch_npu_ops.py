"""Stand-in for ``dlinfer.vendor.ascend.torch_npu_ops``'s decode entry point (our own code).

As in dlinfer-ascend 0.2.7 and main: the two decode functions are imported *by name* from ``.attention``
and looked up as this module's globals by ``paged_decode_attention``, which picks MLA when the key and
value head sizes differ. (The real function is registered into dlinfer's op registry; not needed here.)
"""

import math

from .attention import decode_attention, decode_attention_mla


def paged_decode_attention(
    query,
    key_cache,
    value_cache,
    block_table,
    block_size,
    kv_seq_len,
    max_kv_seq_len,
    num_q_heads,
    num_kv_heads,
    softmax_scale,
    alibi_slopes,
    attn_output,
    q_seq_len=None,
):
    if alibi_slopes is not None:
        raise RuntimeError("stand-in paged_decode_attention: no alibi")
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
            kv_seq_len=kv_seq_len,
            softmax_scale=softmax_scale,
            attn_output=attn_output,
            q_seq_len=q_seq_len,
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
