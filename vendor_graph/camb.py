"""Graph mode for lmdeploy on Cambricon MLU: ``import vendor_graph.camb`` before lmdeploy starts.

Importing activates the Camb profile (:mod:`vendor_graph.vendors.cuda_style`: lmdeploy's CUDA graph runner, adopted,
with the Camb buffers). The room itself imports without activating; :func:`vendor_graph.uninstall` lets a later
import activate again.
"""

from __future__ import annotations

from .install.profile import activation_on_import
from .vendors.cuda_style import CAMB as PROFILE
from .vendors.cuda_style import camb_spec

activate = activation_on_import(PROFILE)

__all__ = ["PROFILE", "activate", "camb_spec"]
