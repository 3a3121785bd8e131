"""Buffer declarations shared by every vendor spec (the model inputs and the context fields that
lmdeploy's ``CudaGraphMixin`` owns), and the static contents of decode graphs."""

from __future__ import annotations

import torch

from .declare import BATCH, BATCH_PLUS_ONE, BLOCKS, SOURCE, TOKENS, BufferField, GraphDims, Ref


def query_lens(dims: GraphDims) -> list[int]:
    """Every row of a decode graph has the same query length (1, or the fixed speculative length)."""
    return [dims.query_len] * dims.batch


def query_starts(dims: GraphDims) -> list[int]:
    return [i * dims.query_len for i in range(dims.batch)]


def query_cumulative(dims: GraphDims) -> list[int]:
    """Cumulative query lengths with the leading 0 (``cu_seqlens_q``), batch + 1 entries."""
    return [i * dims.query_len for i in range(dims.batch + 1)]


def query_cumulative_ends(dims: GraphDims) -> list[int]:
    """Cumulative query lengths without the leading 0, batch entries."""
    return [(i + 1) * dims.query_len for i in range(dims.batch)]


def _ssm_required(graph_meta) -> str | None:
    return "the model has SSM state (graph_meta.is_ssm)" if getattr(graph_meta, "is_ssm", False) else None


def _mrope_required(graph_meta) -> str | None:
    return "the model uses mrope (graph_meta.use_mrope)" if getattr(graph_meta, "use_mrope", False) else None


def model_input_fields() -> tuple[BufferField, ...]:
    """The model kwargs every vendor pads: token ids, positions, embeddings, mrope ids, SSM state ids."""
    return (
        BufferField("input_ids", (1, TOKENS), torch.int64, pad=0,
                    source=Ref.kwarg("input_ids"), bind=(Ref.kwarg("input_ids"),)),
        BufferField("position_ids", (1, TOKENS), torch.int64, pad=0,
                    source=Ref.kwarg("position_ids"), bind=(Ref.kwarg("position_ids"),)),
        BufferField("inputs_embeds", (1, TOKENS, SOURCE), None, pad=0,
                    source=Ref.kwarg("inputs_embeds"), bind=(Ref.kwarg("inputs_embeds"),)),
        BufferField("mrope_position_ids", (3, TOKENS), torch.int64, pad=0,
                    source=Ref.kwarg("mrope_position_ids"),
                    bind=(Ref.kwarg("mrope_position_ids"), Ref.context("mrope_position_ids")),
                    required=_mrope_required),
        # SSM state 0 is lmdeploy's padding state (docs/buffers.md); kernels that do not skip -1 take it safely.
        BufferField("state_ids", (BATCH,), torch.int64, pad=0,
                    source=Ref.kwarg("state_ids"),
                    bind=(Ref.kwarg("state_ids"), Ref.context("state_offsets")),
                    required=_ssm_required),
    )


def block_table_field() -> BufferField:
    # Block 0 is lmdeploy's padding block (docs/buffers.md): padding rows read only that block.
    return BufferField("block_offsets", (BATCH, BLOCKS), torch.int32, pad=0,
                       source=Ref.attn("block_offsets"),
                       bind=(Ref.attn("block_offsets"), Ref.context("block_offsets")))


def adapter_ids_field() -> BufferField:
    # Adapter 0 is "no adapter"; lmdeploy's warm-up passes ids, serving steps without LoRA pass None.
    return BufferField("local_adapter_ids", (BATCH,), torch.int64, pad=0,
                       source=Ref.context("local_adapter_ids"), bind=(Ref.context("local_adapter_ids"),),
                       absent_is_padding=True)


def context_query_fields() -> tuple[BufferField, ...]:
    """``StepContext.q_seqlens`` / ``q_start_loc``: static in a decode graph, in the context's dtypes."""
    return (
        BufferField("context_q_seqlens", (BATCH,), None, pad=0, static=query_lens,
                    source=Ref.context("q_seqlens"), bind=(Ref.context("q_seqlens"),)),
        BufferField("context_q_start_loc", (BATCH,), None, pad=0, static=query_starts,
                    source=Ref.context("q_start_loc"), bind=(Ref.context("q_start_loc"),)),
    )


__all__ = [
    "BATCH_PLUS_ONE",
    "adapter_ids_field",
    "block_table_field",
    "context_query_fields",
    "model_input_fields",
    "query_cumulative",
    "query_cumulative_ends",
    "query_lens",
    "query_starts",
]
