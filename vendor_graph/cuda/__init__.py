"""The CUDA reference vendor: ``import vendor_graph.cuda`` before lmdeploy starts, on an NVIDIA GPU.

It exists to prove the package inside lmdeploy's real PyTorch engine on real graphs: lmdeploy's own
CUDA graph runner, adopted by vendor_graph (:mod:`vendor_graph.adopted`), with vendor_graph's
buffers for what lmdeploy 0.18's Triton decode attention reads (:mod:`vendor_graph.cuda.spec`) in
place of lmdeploy's. Greedy tokens must equal lmdeploy's own graph mode on the same model.
"""

from __future__ import annotations

import functools

from ..adopted import build_adopted_runner
from ..vendor import VendorProfile, activation_on_import
from .spec import cuda_spec, fill_step_meta_buffers, make_step_meta_buffers

PROFILE = VendorProfile(
    name="cuda",
    build_spec=cuda_spec,
    build_runner=functools.partial(build_adopted_runner, vendor="cuda"),
    op_backend=("lmdeploy.pytorch.backends.cuda.op_backend", "CudaOpsBackend"),
    after_make=make_step_meta_buffers,
    after_fill=fill_step_meta_buffers,
)
activate = activation_on_import(PROFILE)

__all__ = ["PROFILE", "activate", "cuda_spec"]
