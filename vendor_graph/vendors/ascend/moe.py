"""lmdeploy's Ascend MoE padding, per runner.

lmdeploy pads the MoE token count inside ``AscendOpsBackend.update_step_context`` through dlinfer's
``get_ascend_compatible_size``, which knows no runner. :func:`route` makes it answer with the bucket of
the runner whose graph the step being prepared takes (a target and its draft model have their own).
"""

from __future__ import annotations

import contextvars
import weakref
from typing import Any

from ...install import patching
from ...sizing import buckets
from ...sizing.buckets import ascend_bucket

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
    return ascend_bucket(batch)


def track(runner: Any) -> Any:
    """Count ``runner`` among the runners the padding can follow; returns it."""
    _built[:] = [ref for ref in _built if ref() is not None] + [weakref.ref(runner)]
    return runner


def route(activation: patching.Activation) -> None:
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
