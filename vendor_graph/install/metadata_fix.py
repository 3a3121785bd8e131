"""lmdeploy 0.18's attention metadata for Camb and MACA: their own ``update_step_context`` still passes 0.17's
keywords to 0.18's ``DlinferAttentionMetadata`` (a ``TypeError`` on the first step), so on 0.18 their
``get_attention_metadata_cls`` returns :func:`metadata_for_018`, a builder that takes those keywords.

What 0.18's decode reads and why its lengths are device tensors: ``docs/internals.md`` (Camb and MACA).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..upstream.compat import LmdeployApi, lmdeploy_api
from . import patching

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


__all__ = ["RENAMED_KEYWORDS", "install_metadata_fix", "metadata_fix_installed", "metadata_fix_patch",
           "metadata_for_018", "needs_metadata_fix"]
