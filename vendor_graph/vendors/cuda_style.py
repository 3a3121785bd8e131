"""Camb and MACA: the dlinfer vendors that run lmdeploy's own CUDA graph runner, adopted by vendor_graph
(:mod:`vendor_graph.runtime.adopted`), with one buffer spec that differs only in ``kv_start_indices``.

The decode attention of both reads its lengths from device tensors and its max-length ints, frozen at capture,
at -1 (derived from the tensors); on lmdeploy 0.18 their own ``update_step_context`` also needs
:mod:`vendor_graph.install.metadata_fix`. What each release's kernels read, with sources: ``docs/upstream.md``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from ..buffers import BATCH, BATCH_PLUS_ONE, BufferField, BufferSpec, Ref
from ..buffers.fields import (
    adapter_ids_field,
    block_table_field,
    context_query_fields,
    model_input_fields,
    query_cumulative,
    query_lens,
)
from ..install.metadata_fix import install_metadata_fix
from ..install.profile import VendorProfile
from ..runtime.adopted import build_adopted_runner
from ..upstream.compat import LmdeployApi


def _derive_from_tensor(dims, attn_metadata) -> int:
    return -1


def cuda_style_spec(vendor: str, api: LmdeployApi, kv_start_shape: tuple, kv_start_dtype: torch.dtype) -> BufferSpec:
    """The buffers of ``vendor``'s decode on ``api``'s lmdeploy, ``kv_start_indices`` laid out as given."""
    # 0.18: the decode kernel reads the cumulative query ends and the KV lengths under these names too.
    cumulative_binds = (Ref.attn("cu_seqlens_q"), Ref.attn("cu_seqlens_q_cpu")) if api.separate_host_seqlens else ()
    kv_binds = (Ref.attn("kv_seqlens_cpu"),) if api.separate_host_seqlens else ()
    fields = (
        *model_input_fields(),
        block_table_field(),
        adapter_ids_field(),
        *context_query_fields(),
        BufferField("kv_seqlens", (BATCH,), torch.int32, pad=0, source=Ref.attn("kv_seqlens"),
                    bind=(Ref.attn("kv_seqlens"), Ref.context("kv_seqlens"), *kv_binds)),
        BufferField("q_seqlens", (BATCH,), None, pad=0, static=query_lens,
                    source=Ref.attn("q_seqlens"), bind=(Ref.attn("q_seqlens"),)),
        BufferField("q_start_loc", (BATCH_PLUS_ONE,), torch.int32, pad=0, static=query_cumulative,
                    source=Ref.attn("q_start_loc"), bind=(Ref.attn("q_start_loc"), *cumulative_binds)),
        # -1: padding rows write no KV slot at all.
        BufferField("kv_start_indices", kv_start_shape, kv_start_dtype, pad=-1,
                    source=Ref.attn("kv_start_indices"), bind=(Ref.attn("kv_start_indices"),)),
    )
    return BufferSpec(
        vendor=vendor,
        fields=fields,
        constants={"max_kv_seq_len": _derive_from_tensor, api.max_q_attr: _derive_from_tensor},
    )


def camb_spec(api: LmdeployApi) -> BufferSpec:
    """Camb: ``kv_start_indices`` int32 over the batch."""
    return cuda_style_spec("camb", api, kv_start_shape=(BATCH,), kv_start_dtype=torch.int32)


def maca_spec(api: LmdeployApi) -> BufferSpec:
    """MACA: ``kv_start_indices`` int64 shaped ``(max_batches, 1)``."""
    return cuda_style_spec("maca", api, kv_start_shape=(BATCH, 1), kv_start_dtype=torch.int64)


def cuda_style_profile(name: str, build_spec: Callable[[LmdeployApi], BufferSpec]) -> VendorProfile:
    """The profile of a vendor on lmdeploy's CUDA runner: adopted runner, ``build_spec``'s buffers, 0.18's fix."""
    return VendorProfile(name=name, build_spec=build_spec,
                         build_runner=functools.partial(build_adopted_runner, vendor=name),
                         extra_setup=functools.partial(install_metadata_fix, vendor=name))


CAMB = cuda_style_profile("camb", camb_spec)
MACA = cuda_style_profile("maca", maca_spec)
PROFILES = {"camb": CAMB, "maca": MACA}

__all__ = ["CAMB", "MACA", "PROFILES", "camb_spec", "cuda_style_profile", "cuda_style_spec", "maca_spec"]
