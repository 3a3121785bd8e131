"""Graph mode for lmdeploy on MetaX MACA: ``import vendor_graph.maca`` before lmdeploy starts.

Importing activates the MACA profile (:mod:`vendor_graph.vendors.cuda_style`: lmdeploy's CUDA graph runner, adopted,
with the MACA buffers). The room itself imports without activating; :func:`vendor_graph.uninstall` lets a later
import activate again.
"""

from __future__ import annotations

from .install.profile import activation_on_import
from .vendors.cuda_style import MACA as PROFILE
from .vendors.cuda_style import maca_spec

activate = activation_on_import(PROFILE)

__all__ = ["PROFILE", "activate", "maca_spec"]
