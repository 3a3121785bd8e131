"""The CUDA reference vendor: ``import vendor_graph.cuda`` before lmdeploy starts, on an NVIDIA GPU.

It exists to prove the package inside lmdeploy's real PyTorch engine on real graphs: lmdeploy's own
CUDA graph runner, adopted by vendor_graph (:mod:`vendor_graph.cuda_runner`), with vendor_graph's
buffers for what lmdeploy 0.18's Triton decode attention reads (:mod:`vendor_graph.specs.cuda`) in
place of lmdeploy's. Greedy tokens must equal lmdeploy's own graph mode on the same model.
"""

from __future__ import annotations

import functools

from ..cuda_runner import build_adopted_runner
from ..specs.cuda import cuda_spec, fill_step_meta_buffers, make_step_meta_buffers
from ..vendor import VendorProfile, install

PROFILE = VendorProfile(
    name="cuda",
    build_spec=cuda_spec,
    build_runner=functools.partial(build_adopted_runner, vendor="cuda"),
    op_backend=("lmdeploy.pytorch.backends.cuda.op_backend", "CudaOpsBackend"),
    after_make=make_step_meta_buffers,
    after_fill=fill_step_meta_buffers,
)
activate = functools.partial(install, PROFILE)  # idempotent; importing this module already did
activate()

__all__ = ["PROFILE", "activate", "cuda_spec"]
