"""Stand-in for the ``dlinfer.ops`` decode attention lmdeploy calls (our own code; signature as dlinfer main's
``dlinfer/ops/llm.py``).

lmdeploy 0.16-0.18 (``pytorch/kernels/dlinfer/pagedattention.py``) pass the first ten arguments positionally
(``q_seqlens`` sixth) and the rest by keyword, ``head_size_v`` included. As dlinfer's, the op has defaults
from ``head_size_v`` on (``head_size_v=0``, ``quant_bits=0``, the others None) and drops ``head_size_v``
before calling the vendor's implementation with sixteen positional arguments.

Differences: dlinfer registers the op as a torch custom op (``dlinfer::paged_decode_attention``) and looks the
vendor's function up in its op registry, filled when ``import dlinfer`` imports the vendor. The stand-in
imports the vendor module when the op is called (so importing ``dlinfer.ops``, which lmdeploy does at module
level, has no side effects) and has an implementation only for ascend (``DLINFER_STUB_VENDOR``).
"""

import importlib
import os

__all__ = ["paged_decode_attention"]

VENDOR_MODULES = {"ascend": "dlinfer.vendor.ascend.torch_npu_ops"}


def _vendor_op(name):
    vendor = os.environ.get("DLINFER_STUB_VENDOR", "ascend")
    if vendor not in VENDOR_MODULES:
        raise NotImplementedError(f"dlinfer.ops.{name} is a test stand-in; no {vendor} kernel runs here")
    return getattr(importlib.import_module(VENDOR_MODULES[vendor]), name)


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
