"""Buffer spec shared by the dlinfer vendors that run on lmdeploy's CUDA graph runner (Camb, MACA).

What their decode attention reads on lmdeploy 0.16 / 0.17 (``{Camb,Maca}OpsBackend.update_step_context``
and ``DlinferAttentionImpl.forward``): ``block_offsets``, ``q_start_loc`` (their cumulative
``cu_seqlens``, batch + 1 entries), ``q_seqlens``, ``kv_seqlens`` and ``kv_start_indices`` on the
device, and the ints ``max_q_seq_len`` / ``max_kv_seq_len``. An int is frozen into the graph at
capture, so both are -1 here: the kernels then derive the maxima from the tensors (dlinfer #298).
The vendors differ only in the layout of ``kv_start_indices``.
"""

from __future__ import annotations

import torch

from .buffers import BATCH, BATCH_PLUS_ONE, BufferField, BufferSpec, Ref
from .compat import LmdeployApi
from .fields import (
    adapter_ids_field,
    block_table_field,
    context_query_fields,
    model_input_fields,
    query_cumulative,
    query_lens,
)


def _derive_from_tensor(dims, attn_metadata) -> int:
    return -1


def cuda_style_spec(vendor: str, api: LmdeployApi, kv_start_shape: tuple, kv_start_dtype: torch.dtype) -> BufferSpec:
    fields = (
        *model_input_fields(),
        block_table_field(),
        adapter_ids_field(),
        *context_query_fields(),
        BufferField("kv_seqlens", (BATCH,), torch.int32, pad=0,
                    source=Ref.attn("kv_seqlens"), bind=(Ref.attn("kv_seqlens"), Ref.context("kv_seqlens"))),
        BufferField("q_seqlens", (BATCH,), None, pad=0, static=query_lens,
                    source=Ref.attn("q_seqlens"), bind=(Ref.attn("q_seqlens"),)),
        BufferField("q_start_loc", (BATCH_PLUS_ONE,), torch.int32, pad=0, static=query_cumulative,
                    source=Ref.attn("q_start_loc"), bind=(Ref.attn("q_start_loc"),)),
        # -1: padding rows write no KV slot at all.
        BufferField("kv_start_indices", kv_start_shape, kv_start_dtype, pad=-1,
                    source=Ref.attn("kv_start_indices"), bind=(Ref.attn("kv_start_indices"),)),
    )
    return BufferSpec(
        vendor=vendor,
        fields=fields,
        constants={"max_kv_seq_len": _derive_from_tensor, api.max_q_attr: _derive_from_tensor},
    )
