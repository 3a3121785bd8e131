"""The CUDA reference room: what ``import vendor_graph.cuda`` installs on an NVIDIA GPU, importable without
activating. It proves the package inside lmdeploy's real PyTorch engine on real graphs: lmdeploy's own CUDA
graph runner, adopted by vendor_graph (:mod:`vendor_graph.runtime.adopted`), with the buffer spec below in place of
lmdeploy's. Greedy tokens must equal lmdeploy's own graph mode on the same model.

Buffer spec of the CUDA reference vendor: what lmdeploy 0.18's CUDA decode reads with its Triton
attention (``backends/cuda/attention/default.py``, ``TritonAttentionImpl``).

Decode reads ``block_offsets`` (int32), ``kv_seqlens``, ``cu_seqlens_q`` (paged attention) and
``q_start_loc`` / ``q_seqlens`` (the KV fill), all on the device; ``max_q_seqlen`` comes from the
implementation, not the metadata. Padding follows lmdeploy's own graph fill
(``fill_graph_common_inputs``): a padding row has query length 1, KV length 1 and a block table of
zeros, so it reads and writes only the reserved block 0.

The Triton implementation's step-metadata builder owns no graph buffers; graphs whose model selected
another implementation (FA3 for speculative decoding, FlashMLA) or that need mrope / SSM state are
refused before anything is allocated, naming what to use instead.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ..buffers import BATCH, BATCH_PLUS_ONE, BufferField, BufferSpec, Ref
from ..buffers.fields import (
    adapter_ids_field,
    block_table_field,
    context_query_fields,
    model_input_fields,
    query_cumulative,
    query_lens,
    query_starts,
)
from ..install.profile import VendorProfile
from ..runtime.adopted import build_adopted_runner
from ..upstream.compat import LmdeployApi

TRITON_BUILDER = "TritonAttentionMetaBuilder"
_INSTEAD = "run it with lmdeploy's own graph mode (do not import vendor_graph.cuda) or with eager_mode=True"


class UnsupportedGraphConfig(ValueError):
    """A graph configuration the CUDA reference spec does not cover."""


def check_cuda_meta(graph_meta: Any) -> None:
    refusals = []
    if getattr(graph_meta, "use_flash_mla", False):
        refusals.append("FlashMLA attention")
    if getattr(graph_meta, "use_fa3_decoding", False) or int(getattr(graph_meta, "decode_query_len", 1) or 1) > 1:
        refusals.append("multi-token (speculative) decoding on FA3")
    if getattr(graph_meta, "use_mrope", False):
        refusals.append("mrope position ids")
    if getattr(graph_meta, "is_ssm", False):
        refusals.append("SSM state")
    plan = getattr(graph_meta, "step_meta_plan", None)
    if plan is not None:
        others = sorted({type(b).__name__ for b in plan.attention_builders} - {TRITON_BUILDER})
        if others:
            refusals.append(f"attention metadata from {', '.join(others)}")
        if plan.step_updaters:
            refusals.append(f"step-metadata updaters {[type(u).__name__ for u in plan.step_updaters]}")
    if refusals:
        raise UnsupportedGraphConfig(
            f"vendor_graph.cuda covers lmdeploy's Triton decode attention only; this graph needs "
            f"{'; '.join(refusals)}: {_INSTEAD}")


def cuda_spec(api: LmdeployApi) -> BufferSpec:
    fields = (
        *model_input_fields(),
        block_table_field(),
        adapter_ids_field(),
        *context_query_fields(),
        # lmdeploy pads KV lengths with the query length: a padding row attends to, and writes, slot 0 of
        # the reserved block 0 only.
        BufferField("kv_seqlens", (BATCH,), torch.int32, pad=1,
                    source=Ref.attn("kv_seqlens"), bind=(Ref.attn("kv_seqlens"), Ref.context("kv_seqlens"))),
        BufferField("q_seqlens", (BATCH,), torch.int32, pad=0, static=query_lens,
                    source=Ref.attn("q_seqlens"), bind=(Ref.attn("q_seqlens"),)),
        BufferField("q_start_loc", (BATCH,), torch.int32, pad=0, static=query_starts,
                    source=Ref.attn("q_start_loc"), bind=(Ref.attn("q_start_loc"),)),
        BufferField("cu_seqlens_q", (BATCH_PLUS_ONE,), torch.int32, pad=0, static=query_cumulative,
                    source=Ref.attn("cu_seqlens_q"), bind=(Ref.attn("cu_seqlens_q"),)),
    )
    return BufferSpec(vendor="cuda", fields=fields, check_meta=check_cuda_meta)


def _step_context():
    from lmdeploy.pytorch.model_inputs import get_step_ctx_manager

    return get_step_ctx_manager().current_context()


def make_step_meta_buffers(graph_meta: Any, input_buffers: dict, attn_metadata: Any) -> None:
    """lmdeploy 0.18's implementation-owned graph buffers (none for Triton), so its runner's capture
    finds ``graph_meta.step_meta_buffers`` where it looks."""
    plan = getattr(graph_meta, "step_meta_plan", None)
    if plan is not None:
        graph_meta.step_meta_buffers = plan.make_cudagraph_buffers(graph_meta, input_buffers, _step_context())


def fill_step_meta_buffers(graph_meta: Any, attn_metadata: Any) -> None:
    """Re-attach the implementation's per-group metadata to this step's ``attn_metadata``."""
    plan = getattr(graph_meta, "step_meta_plan", None)
    if plan is not None:
        plan.fill_cudagraph_buffers(graph_meta, graph_meta.input_buffers, _step_context(),
                                    graph_meta.step_meta_buffers, attn_metadata)


PROFILE = VendorProfile(
    name="cuda",
    build_spec=cuda_spec,
    build_runner=functools.partial(build_adopted_runner, vendor="cuda"),
    op_backend=("lmdeploy.pytorch.backends.cuda.op_backend", "CudaOpsBackend"),
    after_make=make_step_meta_buffers,
    after_fill=fill_step_meta_buffers,
)
