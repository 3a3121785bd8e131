"""Stand-in for the ``dlinfer.ops`` decode attention and KV fill lmdeploy calls (our own code; signatures as
dlinfer main's ``dlinfer/ops/llm.py``).

lmdeploy 0.16-0.18 (``pytorch/kernels/dlinfer/pagedattention.py``) pass the first ten arguments positionally
(``q_seqlens`` sixth) and the rest by keyword, ``head_size_v`` included. As dlinfer's, the op has defaults
from ``head_size_v`` on (``head_size_v=0``, ``quant_bits=0``, the others None) and drops ``head_size_v``
before calling the vendor's implementation with sixteen positional arguments.

Differences: dlinfer registers the op as a torch custom op (``dlinfer::paged_decode_attention``) and looks the
vendor's function up in its op registry, filled when ``import dlinfer`` imports the vendor. The stand-in
imports the vendor module when the op is called (so importing ``dlinfer.ops``, which lmdeploy does at module
level, has no side effects); the vendor is ``dlinfer.vendor.vendor_name()``. Ascend has decode attention,
Camb and MACA decode attention and the KV fill.

``fill_kv_cache``: dlinfer's defaults (``k_scales_zeros`` / ``v_scales_zeros`` empty, ``quant_bits=0``), the
vendor's function called with all eight arguments positionally.
"""

import importlib

from dlinfer.vendor import vendor_name

__all__ = ["fill_kv_cache", "paged_decode_attention"]

VENDOR_MODULES = {
    "ascend": "dlinfer.vendor.ascend.torch_npu_ops",
    "camb": "dlinfer.vendor.camb.camb_ops",
    "maca": "dlinfer.vendor.maca.maca_ops",
}


def _vendor_op(name):
    vendor = vendor_name()
    op = getattr(importlib.import_module(VENDOR_MODULES[vendor]), name, None) if vendor in VENDOR_MODULES else None
    if op is None:
        raise NotImplementedError(f"dlinfer.ops.{name} is a test stand-in; no {vendor} kernel runs here")
    return op


def fill_kv_cache(
    key,
    value,
    key_cache,
    value_cache,
    kv_indices,
    k_scales_zeros=(),
    v_scales_zeros=(),
    quant_bits=0,
):
    return _vendor_op("fill_kv_cache")(
        key, value, key_cache, value_cache, kv_indices, k_scales_zeros, v_scales_zeros, quant_bits
    )


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
    head_size_v=0,
    softmax_scale=None,
    alibi_slopes=None,
    attn_output=None,
    kv_scales=None,
    kv_zeros=None,
    quant_bits=0,
):
    return _vendor_op("paged_decode_attention")(
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
    )
