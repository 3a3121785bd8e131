"""Graph mode for lmdeploy on Huawei Ascend: ``import vendor_graph.ascend`` before lmdeploy starts.

Importing installs the Ascend buffer methods on lmdeploy's ``CudaGraphMixin`` and replaces what
``AscendOpsBackend.build_graph_runner`` builds with :class:`~vendor_graph.npu.runner.AscendGraphRunner`
(keeping the builder's side effects: ``AscendOpsBackend.enable_graph`` and ``max_batches``). lmdeploy's
Ascend MoE padding, which asks dlinfer's ``get_ascend_compatible_size``, is routed through the
sizes of the runner serving that step, so the MoE token count and the graph's batch always agree.

Vendor attention code registers its captured tasks through :func:`call_attention` (``vendor_graph.npu.hook``).
"""

from __future__ import annotations

import contextvars
import weakref
from typing import Any

from .. import buckets, patching
from ..npu import dlinfer_adapter
from ..npu.hook import call_attention, capturing
from ..npu.seqlen import seqlen_update_path
from ..specs.ascend import ascend_spec
from ..vendor import VendorProfile, install

DLINFER_ASCEND_RUNNER_MODULE = "dlinfer.framework.lmdeploy_ext.cudagraph.ascend_cudagraph"
ASCEND_OP_BACKEND = ("lmdeploy.pytorch.backends.dlinfer.ascend.op_backend", "AscendOpsBackend")

# The step context lmdeploy's AscendOpsBackend.update_step_context is preparing (it pads the MoE there).
_preparing: contextvars.ContextVar[Any] = contextvars.ContextVar("vendor_graph_ascend_preparing", default=None)
_built: list[weakref.ref] = []  # Ascend runners built here, oldest first


def _runner_for(step_context: Any) -> Any:
    """The runner whose graph ``step_context``'s step takes: the one built for its model config (a target
    and its draft model have their own); without a step context, the latest built."""
    runners = [r for r in (ref() for ref in _built) if r is not None]
    config = getattr(step_context, "model_config", None)
    if config is not None:
        for runner in runners:
            if runner.model_config is config:
                return runner
    return runners[-1] if runners else None


def moe_padded_batch(batch: int) -> int:
    """The graph batch lmdeploy's Ascend MoE must pad ``batch`` to: the bucket of the runner that serves
    the step being prepared."""
    runner = _runner_for(_preparing.get())
    sizes = None if runner is None else runner.get_capture_batch_sizes()
    if sizes and 1 <= batch <= sizes[-1]:
        return buckets.pad_to_bucket(sizes, batch)
    return buckets.ascend_bucket(batch)


def _build_runner(original, *args, **kwargs):
    from ..npu.runner import build_graph_runner  # torch and lmdeploy: only once lmdeploy builds a runner

    runner = build_graph_runner(original, *args, **kwargs)
    _built[:] = [ref for ref in _built if ref() is not None] + [weakref.ref(runner)]
    return runner


def _route_moe_padding(activation: patching.Activation) -> None:
    def patch_size(module) -> None:
        activation.add(patching.Patch(module, "get_ascend_compatible_size", moe_padded_batch, owner_is_module=True))

    def patch_step_context(module) -> None:
        backend = getattr(module, ASCEND_OP_BACKEND[1])
        prepare = backend.__dict__["update_step_context"].__func__

        def update_step_context(cls, step_context):
            token = _preparing.set(step_context)
            try:
                return prepare(cls, step_context)
            finally:
                _preparing.reset(token)

        activation.add(patching.Patch(backend, "update_step_context", classmethod(update_step_context)))

    patching.when_imported(DLINFER_ASCEND_RUNNER_MODULE, patch_size)
    patching.when_imported(ASCEND_OP_BACKEND[0], patch_step_context)


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
