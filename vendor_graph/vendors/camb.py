"""The Cambricon MLU room: what ``import vendor_graph.camb`` installs, importable without activating.

Camb runs lmdeploy's own CUDA graph runner (torch_mlu exposes a CUDA-style graph API), adopted by
vendor_graph (:mod:`vendor_graph.runtime.adopted`: stats, fault handling), with vendor_graph's buffers:
``kv_start_indices`` int32 over the batch, padded with -1, and ``max_kv_seq_len`` / the max-q field
set to -1 so the kernel derives them from the tensors instead of using the values frozen at capture.
On lmdeploy 0.18 its own ``CambOpsBackend.update_step_context`` builds 0.18's attention metadata
through :func:`vendor_graph.vendors.cuda_style.install_metadata_fix` (without it, the first step raises TypeError).
"""


from __future__ import annotations

import functools

import torch

from ..buffers import BATCH, BufferSpec
from ..install.profile import VendorProfile
from ..runtime.adopted import build_adopted_runner
from ..upstream.compat import LmdeployApi
from .cuda_style import cuda_style_spec, install_metadata_fix


def camb_spec(api: LmdeployApi) -> BufferSpec:
    """Camb: ``kv_start_indices`` int32 over the batch."""
    return cuda_style_spec("camb", api, kv_start_shape=(BATCH,), kv_start_dtype=torch.int32)


PROFILE = VendorProfile(name="camb", build_spec=camb_spec,
                        build_runner=functools.partial(build_adopted_runner, vendor="camb"),
                        extra_setup=functools.partial(install_metadata_fix, vendor="camb"))

__all__ = ["PROFILE", "camb_spec"]
