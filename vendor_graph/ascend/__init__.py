"""Graph mode for lmdeploy on Huawei Ascend: ``import vendor_graph.ascend`` before lmdeploy starts.

Importing installs the Ascend buffer methods on lmdeploy's ``CudaGraphMixin`` and replaces what
``AscendOpsBackend.build_graph_runner`` builds with :class:`~vendor_graph.npu.runner.AscendGraphRunner`
(keeping the builder's side effects: ``AscendOpsBackend.enable_graph`` and ``max_batches``). lmdeploy's
Ascend MoE padding, which asks dlinfer's ``get_ascend_compatible_size``, is routed through the
runner's own sizes (:func:`vendor_graph.buckets.pad_to_bucket`), so the MoE token count and the
graph's batch always agree.

Vendor attention code registers its captured tasks through :func:`call_attention` (``vendor_graph.npu.hook``).
"""

from __future__ import annotations

from .. import buckets, patching
from ..npu import dlinfer_adapter
from ..npu.hook import call_attention, capturing
from ..npu.seqlen import seqlen_update_path
from ..specs.ascend import ascend_spec
from ..vendor import VendorProfile, install

DLINFER_ASCEND_RUNNER_MODULE = "dlinfer.framework.lmdeploy_ext.cudagraph.ascend_cudagraph"

# Capture sizes of the latest runner built here (the target model's; a draft model shares max_batches).
_moe_capture_sizes: list[int] | None = None


def moe_padded_batch(batch: int) -> int:
    """The graph batch lmdeploy's Ascend MoE must pad ``batch`` to: the runner's bucket of it."""
    sizes = _moe_capture_sizes
    if sizes is not None and 1 <= batch <= sizes[-1]:
        return buckets.pad_to_bucket(sizes, batch)
    return buckets.ascend_bucket(batch)


def _build_runner(original, *args, **kwargs):
    global _moe_capture_sizes
    from ..npu.runner import build_graph_runner

    runner = build_graph_runner(original, *args, **kwargs)
    _moe_capture_sizes = runner.get_capture_batch_sizes()
    return runner


def _route_moe_padding(activation: patching.Activation) -> None:
    def patch(module) -> None:
        activation.add(patching.Patch(module, "get_ascend_compatible_size", moe_padded_batch, owner_is_module=True))

    patching.when_imported(DLINFER_ASCEND_RUNNER_MODULE, patch)


def _setup(activation: patching.Activation) -> None:
    _route_moe_padding(activation)
    # dlinfer's Ascend decode attention registers its captured tasks with our runner.
    dlinfer_adapter.install(activation)


PROFILE = VendorProfile(
    name="ascend",
    build_spec=ascend_spec,
    build_runner=_build_runner,
    extra_setup=_setup,
)


def activate():
    """Install vendor_graph.ascend (idempotent); importing this module already did, unless undone since."""
    return install(PROFILE)


activate()

__all__ = ["PROFILE", "activate", "ascend_spec", "call_attention", "capturing", "moe_padded_batch",
           "seqlen_update_path"]
