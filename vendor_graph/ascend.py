"""Graph mode for lmdeploy on Huawei Ascend: ``import vendor_graph.ascend`` before lmdeploy starts.

Importing activates the Ascend profile (:mod:`vendor_graph.vendors.ascend`): lmdeploy's ``CudaGraphMixin``
buffer methods become the Ascend spec's, and ``AscendOpsBackend.build_graph_runner`` builds vendor_graph's
NPUGraph runner. The room itself imports without activating, so reading Ascend's facts never makes this
import a no-op, and :func:`vendor_graph.uninstall` lets a later import activate again.
"""

from __future__ import annotations

from .install.profile import activation_on_import
from .vendors.ascend import PROFILE, ascend_spec, call_attention, capturing, seqlen_update_path

activate = activation_on_import(PROFILE)

__all__ = ["PROFILE", "activate", "ascend_spec", "call_attention", "capturing", "seqlen_update_path"]
