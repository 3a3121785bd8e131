"""The CUDA reference vendor, on an NVIDIA GPU: ``import vendor_graph.cuda`` before lmdeploy starts.

Importing activates the CUDA reference profile (:mod:`vendor_graph.vendors.cuda`: lmdeploy's CUDA graph runner,
adopted, with vendor_graph's buffers for lmdeploy 0.18's Triton decode). The room itself imports without activating;
:func:`vendor_graph.uninstall` lets a later import activate again.
"""

from __future__ import annotations

from .install.profile import activation_on_import
from .vendors.cuda import PROFILE, cuda_spec

activate = activation_on_import(PROFILE)

__all__ = ["PROFILE", "activate", "cuda_spec"]
