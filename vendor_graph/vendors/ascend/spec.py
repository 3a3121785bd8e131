"""What Ascend decode attention reads, per lmdeploy release, as buffer declarations.

Bound ``attn_metadata`` fields by release (from lmdeploy's ``AscendOpsBackend.update_step_context``
and ``DlinferAttentionImpl.forward`` of each wheel):

=====================  ==========================================  ==========================================
field                  0.16 / 0.17                                 0.18
=====================  ==========================================  ==========================================
block_offsets          device int32 (B, blocks)                    same
kv_seqlens             HOST int32 (B,)  -> FIA actual_seq_lengths  device int32 (B,)
kv_seqlens_cpu         -                                           HOST int32 (B,)
q_seqlens              HOST int32 cumulative ends (B,)             device (B,), per-sequence
cu_seqlens_q           -                                           device int32 (B+1,)
cu_seqlens_q_cpu       -                                           HOST int32 (B+1,)
q_start_loc            device cu_seqlens (B+1,), GDN models only   device int32 (B,) = cu_seqlens_q[:-1]
kv_start_indices       device int32, one per token, pad -1         same
cache_seqlens          device int32 (B,), GDN models only          same
attention_mask         [fixed causal mask] multi-token only        same
max_kv_seq_len         None in decode                              int (frozen at capture: set to the cap)
=====================  ==========================================  ==========================================

Plus ``StepContext``: block_offsets, q_seqlens, q_start_loc, kv_seqlens (device), local_adapter_ids,
state_offsets, mrope_position_ids, and ``moe_metadata.x_active_mask`` (MC2 MoE; padding rows False).

The host seq lens cannot reach a captured graph through a buffer write: the runner refreshes them in
the captured attention tasks after each fill (``vendor_graph.ascend`` runner, seq-len updater). In
``input_buffers`` the host KV lengths are :data:`HOST_KV_SEQLENS` and the device copy is
``kv_seqlens_device``.
"""

from __future__ import annotations

import torch

from ...buffers import BATCH, BATCH_PLUS_ONE, TOKENS, BufferField, BufferSpec, HeldAttr, Placement, Ref
from ...buffers.fields import (
    adapter_ids_field,
    block_table_field,
    context_query_fields,
    model_input_fields,
    query_cumulative,
    query_cumulative_ends,
    query_lens,
    query_starts,
)
from ...upstream.compat import LmdeployApi

HOST = Placement.HOST


def _refuse_sparse_attention(graph_meta) -> None:
    if getattr(graph_meta, "mla_index_topk", None) is not None:
        raise NotImplementedError(
            "vendor_graph.ascend: sparse-attention (NSA/DSA) decode graphs are not supported: their "
            "kv_flatten_size is a Python int frozen at capture. Run this model with --eager-mode"
        )


def _max_kv_len_cap(dims, attn_metadata) -> int:
    # An int here is frozen into the graph; the block table's capacity is right for every replay.
    return dims.blocks * int(attn_metadata.block_size)


def kv_slot_padding(dims, graph_meta) -> list[int]:
    """The KV slot of each padding token.

    Non-MLA caches are written by ATB ReshapeAndCache, whose kernels skip a negative slot (every ND/NZ
    variant on A2/A3/310P): -1, so a padding row writes nothing, not even reserved block 0. MLA caches are
    written by ``npu_scatter_nd_update_``, where a negative index is documented as unsupported: distinct
    slots of block 0 (lmdeploy keeps it out of every sequence), cycling when the padding outgrows one block.
    """
    if not getattr(graph_meta, "kv_is_mla", False):
        return [-1] * dims.tokens
    block_size = int(getattr(graph_meta, "kv_block_size", 0) or 1)
    return [i % block_size for i in range(dims.tokens)]


HOST_KV_SEQLENS = "kv_seqlens"  # the host buffer of KV lengths the runner's seq-len refresh reads each replay


def ascend_spec(api: LmdeployApi) -> BufferSpec:
    common = (
        *model_input_fields(),
        block_table_field(),
        adapter_ids_field(),
        BufferField("kv_start_indices", (TOKENS,), torch.int32, pad=kv_slot_padding,
                    source=Ref.attn("kv_start_indices"), bind=(Ref.attn("kv_start_indices"),)),
        BufferField("x_active_mask", (TOKENS,), torch.bool, pad=False,
                    source=Ref.context("moe_metadata.x_active_mask"),
                    bind=(Ref.context("moe_metadata.x_active_mask"),)),
        BufferField("cache_seqlens", (BATCH,), torch.int32, pad=0,
                    source=Ref.attn("cache_seqlens"), bind=(Ref.attn("cache_seqlens"),)),
        *context_query_fields(),
    )
    if api.separate_host_seqlens:  # 0.18
        release = (
            BufferField("kv_seqlens_device", (BATCH,), torch.int32, pad=0,
                        source=Ref.attn("kv_seqlens"),
                        bind=(Ref.attn("kv_seqlens"), Ref.context("kv_seqlens"))),
            BufferField(HOST_KV_SEQLENS, (BATCH,), torch.int32, pad=0, placement=HOST,
                        source=Ref.attn("kv_seqlens_cpu"), bind=(Ref.attn("kv_seqlens_cpu"),)),
            BufferField("q_seqlens", (BATCH,), None, pad=0, static=query_lens,
                        source=Ref.attn("q_seqlens"), bind=(Ref.attn("q_seqlens"),)),
            BufferField("cu_seqlens_q", (BATCH_PLUS_ONE,), torch.int32, pad=0, static=query_cumulative,
                        bind=(Ref.attn("cu_seqlens_q"),)),
            BufferField("q_start_loc", (BATCH,), torch.int32, pad=0, static=query_starts,
                        bind=(Ref.attn("q_start_loc"),)),
            BufferField("cu_seqlens_q_cpu", (BATCH_PLUS_ONE,), torch.int32, pad=0, placement=HOST,
                        static=query_cumulative, bind=(Ref.attn("cu_seqlens_q_cpu"),)),
        )
        constants = {"max_kv_seq_len": _max_kv_len_cap}
    else:  # 0.16, 0.17
        release = (
            BufferField("kv_seqlens_device", (BATCH,), torch.int32, pad=0,
                        source=Ref.context("kv_seqlens"), bind=(Ref.context("kv_seqlens"),)),
            BufferField(HOST_KV_SEQLENS, (BATCH,), torch.int32, pad=0, placement=HOST,
                        source=Ref.attn("kv_seqlens"), bind=(Ref.attn("kv_seqlens"),)),
            BufferField("q_seqlens", (BATCH,), torch.int32, pad=0, placement=HOST,
                        static=query_cumulative_ends, bind=(Ref.attn("q_seqlens"),)),
            # Set by lmdeploy only for gated-delta (GDN) models: their cu_seqlens, batch + 1 entries.
            BufferField("q_start_loc", (BATCH_PLUS_ONE,), torch.int32, pad=0, static=query_cumulative,
                        source=Ref.attn("q_start_loc"), bind=(Ref.attn("q_start_loc"),)),
        )
        constants = {}
    return BufferSpec(
        vendor="ascend",
        fields=common + release,
        constants=constants,
        held=(HeldAttr("attention_mask"),),
        check_meta=_refuse_sparse_attention,
    )
