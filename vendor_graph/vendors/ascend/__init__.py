"""The Ascend room: what ``import vendor_graph.ascend`` installs, importable without activating anything.

The profile patches lmdeploy's ``CudaGraphMixin`` buffer methods with the Ascend spec (:mod:`.spec`) and
replaces what ``AscendOpsBackend.build_graph_runner`` builds with :class:`.runner.AscendGraphRunner`
(keeping the builder's side effects: ``AscendOpsBackend.enable_graph`` and ``max_batches``). lmdeploy's
Ascend MoE padding, which asks dlinfer's ``get_ascend_compatible_size``, is routed through the sizes of the
runner serving that step (:mod:`.moe`), so the MoE token count and the graph's batch always agree. Vendor
attention code registers its captured tasks through :func:`.hook.call_attention`.
"""

from __future__ import annotations

from ... import patching
from ...vendor import VendorProfile
from . import dlinfer_adapter, moe
from .buckets import ascend_capture_sizes
from .hook import call_attention, capturing
from .seqlen import seqlen_update_path
from .spec import ascend_spec


def _build_runner(original, *args, **kwargs):
    from .runner import build_graph_runner  # torch and lmdeploy: only once lmdeploy builds a runner

    return moe.track(build_graph_runner(original, *args, **kwargs))


def _setup(activation: patching.Activation) -> None:
    dlinfer_adapter.check_installed()  # dlinfer-ascend 0.2.7 cannot decode with lmdeploy 0.16-0.18 at all
    moe.route(activation)
    # dlinfer's Ascend decode attention registers its captured tasks with our runner.
    dlinfer_adapter.install(activation)


PROFILE = VendorProfile(
    name="ascend",
    build_spec=ascend_spec,
    build_runner=_build_runner,
    extra_setup=_setup,
    capture_rule=ascend_capture_sizes,
)

__all__ = ["PROFILE", "ascend_spec", "call_attention", "capturing", "seqlen_update_path"]
