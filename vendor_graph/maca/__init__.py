"""Graph mode for lmdeploy on MetaX MACA: ``import vendor_graph.maca`` before lmdeploy starts.

MACA runs lmdeploy's own CUDA graph runner (the MACA torch build is CUDA-compatible), adopted by
vendor_graph (:mod:`vendor_graph.cuda_runner`: stats, fault handling), with vendor_graph's buffers:
``kv_start_indices`` int64 shaped ``(max_batches, 1)``, padded with -1, and the max-length ints at
-1 (lmdeploy's MACA backend already passes -1 when decoding; kept explicit).
"""

from __future__ import annotations

import functools

from ..cuda_runner import build_adopted_runner
from ..specs.cuda_style import maca_spec
from ..vendor import VendorProfile, install

PROFILE = VendorProfile(name="maca", build_spec=maca_spec,
                        build_runner=functools.partial(build_adopted_runner, vendor="maca"))
activate = functools.partial(install, PROFILE)  # idempotent; importing this module already did
activate()

__all__ = ["PROFILE", "activate", "maca_spec"]
