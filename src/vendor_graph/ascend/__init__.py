"""Graph mode for lmdeploy on Huawei Ascend: ``import vendor_graph.ascend`` before lmdeploy starts.

Importing installs the Ascend buffer methods on lmdeploy's ``CudaGraphMixin`` and wraps
``AscendOpsBackend.build_graph_runner``. Until vendor_graph's own NPUGraph runner lands, the builder
keeps lmdeploy's (which builds dlinfer's ``AscendGraphRunner`` and sets ``enable_graph`` and
``max_batches``), and vendor_graph's buffer methods stay in force around it.
"""

from __future__ import annotations

from ..specs.ascend import ascend_spec
from ..vendor import VendorProfile, install

PROFILE = VendorProfile(
    name="ascend",
    op_backend_module="lmdeploy.pytorch.backends.dlinfer.ascend.op_backend",
    op_backend_class="AscendOpsBackend",
    build_spec=ascend_spec,
)


def activate():
    """Install vendor_graph.ascend (idempotent); importing this module already did, unless undone since."""
    return install(PROFILE)


activate()

__all__ = ["PROFILE", "activate", "ascend_spec"]
