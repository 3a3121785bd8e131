"""What the dlinfer vendors on lmdeploy's CUDA graph runner (Camb, MACA) share: their buffer spec, and on
lmdeploy 0.18 the attention metadata their own ``update_step_context`` can no longer build.

What their decode attention reads on lmdeploy 0.16 / 0.17 (``{Camb,Maca}OpsBackend.update_step_context``
and ``DlinferAttentionImpl.forward``): ``block_offsets``, ``q_start_loc`` (their cumulative
``cu_seqlens``, batch + 1 entries), ``q_seqlens``, ``kv_seqlens`` and ``kv_start_indices`` on the
device, and the ints ``max_q_seq_len`` / ``max_kv_seq_len``. An int is frozen into the graph at
capture, so both are -1 here: the kernels then derive the maxima from the tensors (dlinfer #298).
The vendors differ only in the layout of ``kv_start_indices``.

lmdeploy 0.18 reads ``cu_seqlens_q``, ``cu_seqlens_q_cpu`` and ``kv_seqlens_cpu`` instead of
``q_start_loc``, and its decode kernel passes ``cu_seqlens_q_cpu[1:]`` and ``kv_seqlens_cpu`` to dlinfer's
``paged_decode_attention`` as ``q_seq_len`` / ``kv_seq_len``. dlinfer's Camb decode hands ``kv_seq_len`` to
``tmo.single_query_cached_kv_attn`` and MACA's to ``flash_attn_with_kvcache(cache_seqlens=)``: device
kernels, so in decode those two fields are the device tensors (a host tensor would be frozen into a graph
at its capture-time lengths), bound to the same buffers as ``q_start_loc`` / ``kv_seqlens``.
"""

from __future__ import annotations

import dataclasses
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
)
from ..install import patching
from ..upstream.compat import LmdeployApi, lmdeploy_api


def _derive_from_tensor(dims, attn_metadata) -> int:
    return -1


def cuda_style_spec(vendor: str, api: LmdeployApi, kv_start_shape: tuple, kv_start_dtype: torch.dtype) -> BufferSpec:
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


# -- lmdeploy 0.18: the metadata Camb's and MACA's own update_step_context build --------------------------

# Keywords lmdeploy 0.18.0's Camb/MACA update_step_context still pass, and what 0.18's DlinferAttentionMetadata
# calls them (cu_seq_lens_kv, cumulative KV lengths with a leading 0, was removed; cu_seqlens_k is that).
RENAMED_KEYWORDS = {"max_q_seq_len": "max_q_seqlen", "cu_seq_lens_kv": "cu_seqlens_k"}


def metadata_for_018(metadata_cls: type):
    """The ``attn_meta_cls`` lmdeploy 0.18's Camb/MACA ``update_step_context`` call, building 0.18's
    ``DlinferAttentionMetadata``: the renamed keywords under their new names, ``cu_seqlens_q`` (the cumulative
    query ends those backends pass as ``q_start_loc``), and ``cu_seqlens_q_cpu`` / ``kv_seqlens_cpu``: in
    decode always the device tensors themselves (their decode kernels run on the device), in prefill host
    copies unless the backend set them (what the names promise; prefill is never captured)."""
    fields = {f.name for f in dataclasses.fields(metadata_cls)}

    def build(is_decoding: bool, block_offsets: torch.Tensor, **kwargs: Any):
        for old, new in RENAMED_KEYWORDS.items():
            if old in kwargs and old not in fields:
                value = kwargs.pop(old)
                if kwargs.get(new) is None:
                    kwargs[new] = value
        cumulative = kwargs.get("cu_seqlens_q")
        if cumulative is None:
            cumulative = kwargs["cu_seqlens_q"] = kwargs.get("q_start_loc")
        kv_seqlens = kwargs.get("kv_seqlens")
        for name, tensor in (("cu_seqlens_q_cpu", cumulative), ("kv_seqlens_cpu", kv_seqlens)):
            if is_decoding:
                kwargs[name] = tensor
            elif kwargs.get(name) is None and tensor is not None:
                kwargs[name] = tensor.cpu()
        return metadata_cls(is_decoding, block_offsets, **kwargs)

    build.__qualname__ = build.__name__ = "metadata_for_018"
    build.__module__ = __name__
    return build


def needs_metadata_fix(api: LmdeployApi) -> bool:
    """lmdeploy 0.18's layout (separate host-length fields, ``max_q_seqlen``): the Camb/MACA builders need it."""
    return api.separate_host_seqlens


def install_metadata_fix(activation: patching.Activation, vendor: str) -> None:
    """On lmdeploy 0.18, make ``<Vendor>OpsBackend.update_step_context`` (lmdeploy's own, unchanged) build
    0.18's metadata: its ``get_attention_metadata_cls``, which only that method calls, returns
    :func:`metadata_for_018`. Nothing is installed on 0.16 / 0.17."""
    if not needs_metadata_fix(lmdeploy_api()):
        return
    module = f"lmdeploy.pytorch.backends.dlinfer.{vendor}.op_backend"

    def patch(op_backend_module) -> None:
        activation.add(metadata_fix_patch(getattr(op_backend_module, f"{vendor.capitalize()}OpsBackend")))

    patching.when_imported(module, patch)


def metadata_fix_patch(backend: type) -> patching.Patch:
    """The patch (not yet applied) that makes ``backend.get_attention_metadata_cls()`` return
    :func:`metadata_for_018` over its current class."""
    build = metadata_for_018(backend.get_attention_metadata_cls())

    def get_attention_metadata_cls():
        return build

    return patching.Patch(backend, "get_attention_metadata_cls", staticmethod(get_attention_metadata_cls))


def metadata_fix_installed(backend: type) -> bool:
    """Whether ``backend``'s metadata class is :func:`metadata_for_018` (vendor_graph's fix is in force)."""
    return getattr(backend.get_attention_metadata_cls(), "__qualname__", None) == "metadata_for_018"
