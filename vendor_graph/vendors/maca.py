"""The MetaX MACA room: what ``import vendor_graph.maca`` installs, importable without activating.

MACA runs lmdeploy's own CUDA graph runner (the MACA torch build is CUDA-compatible), adopted by
vendor_graph (:mod:`vendor_graph.runtime.adopted`: stats, fault handling), with vendor_graph's buffers:
``kv_start_indices`` int64 shaped ``(max_batches, 1)``, padded with -1, and the max-length ints at
-1 (lmdeploy's MACA backend already passes -1 when decoding; kept explicit).
On lmdeploy 0.18 its own ``MacaOpsBackend.update_step_context`` builds 0.18's attention metadata
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


def maca_spec(api: LmdeployApi) -> BufferSpec:
    """MACA: ``kv_start_indices`` int64 shaped ``(max_batches, 1)``."""
    return cuda_style_spec("maca", api, kv_start_shape=(BATCH, 1), kv_start_dtype=torch.int64)


PROFILE = VendorProfile(name="maca", build_spec=maca_spec,
                        build_runner=functools.partial(build_adopted_runner, vendor="maca"),
                        extra_setup=functools.partial(install_metadata_fix, vendor="maca"))

__all__ = ["PROFILE", "maca_spec"]
