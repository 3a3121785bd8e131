"""Route dlinfer's Ascend decode attention through :func:`vendor_graph.npu.hook.call_attention`.

lmdeploy's Ascend backend runs its decode attention through dlinfer
(``dlinfer.ops.paged_decode_attention`` -> ``dlinfer.vendor.ascend.torch_npu_ops.paged_decode_attention``),
which calls two module-level functions, ``decode_attention`` and ``decode_attention_mla``. Those call
the Ascend kernels directly (``torch.ops.atb._npu_paged_attention``,
``torch.ops.npu.npu_fused_infer_attention_score``, ``torch.ops.atb._npu_paged_attention_mla``) and do
their own graph bookkeeping only while dlinfer's class-level flag ``AscendGraphRunner.capturing`` is
set. vendor_graph's runner never sets that flag (dlinfer's runner is not built when
``vendor_graph.ascend`` is active), so without this adapter the kernels would be captured with their
host KV lengths frozen and nothing registered to refresh them (the runner then refuses the graph:
"no attention op registered").

What :func:`install` does, once each dlinfer module has finished importing (either import order):
it replaces ``decode_attention`` and ``decode_attention_mla`` in every dlinfer module that binds them
(``dlinfer.vendor.ascend.attention`` defines them; ``dlinfer.vendor.ascend.torch_npu_ops`` imports
them by name and looks them up as module globals at each call) with a thin wrapper, registered as a
reversible :class:`vendor_graph.patching.Patch`. Outside a vendor_graph capture the wrapper is one
extra Python call around dlinfer's own function. During a capture (a :class:`~vendor_graph.npu.hook.
CaptureScope` is open in this context) it runs dlinfer's function under a ``TorchDispatchMode`` that
sends each Ascend attention operator it reaches (the ops of :data:`vendor_graph.npu.seqlen.
ATTENTION_OPS`) through ``call_attention``; every other operator runs unchanged. dlinfer's own code
therefore keeps choosing layouts, views and kernels per version, and its tasks register with our
runner, which picks the update path per op. dlinfer's bookkeeping keyed on
``AscendGraphRunner.capturing`` cannot fire as well: if that flag is found set during one of our
captures (dlinfer's runner capturing at the same time), the wrapper raises instead of letting both
record the same task, and the runner runs that key eager with the reason.

Verified against a stand-in only: dlinfer cannot be imported on a CPU machine (its wheels are aarch64
and import torch_npu). The stand-in (the simulator package's ``dlinfer/vendor/ascend/{attention,torch_npu_ops}.py``)
has the same module and function names and calls the same operators with the same argument spellings
as the versions below. Function names this adapter expects:

=============================  ===========================================================================
dlinfer version                where ``decode_attention`` / ``decode_attention_mla`` live; kernels reached
=============================  ===========================================================================
dlinfer-ascend 0.2.7 (PyPI)    defined in ``vendor.ascend.attention``, imported by name into
                               ``vendor.ascend.torch_npu_ops``; outside dlinfer's capture flag the decode
                               kernel is ``atb._npu_paged_attention(..., context_lens=kv_seq_len, out=)``,
                               MLA is ``atb._npu_paged_attention_mla(..., context_lens=kv_seq_len, out=)``
GitHub main (0.2.8, 2026)      same modules and names; ``decode_attention`` gains ``q_seq_len`` and the
                               quantised-KV arguments; its default kernel is the functional
                               ``npu.npu_fused_infer_attention_score(..., input_layout="TND",
                               actual_seq_lengths_kv=kv_seq_len)``; MLA unchanged
older GitHub revisions         both functions defined in ``vendor.ascend.torch_npu_ops`` itself (no
                               ``attention`` module); patched there
=============================  ===========================================================================

A module that is imported but lacks an expected function is reported with ``logger.error`` naming it;
nothing is patched in its place. The runner's post-capture check then refuses graphs whose attention
did not register, so the failure mode is "eager, with the reason logged", never stale lengths.
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Callable
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

from .. import patching
from . import hook
from .seqlen import ATTENTION_OPS

logger = logging.getLogger("vendor_graph")

ATTENTION_MODULE = "dlinfer.vendor.ascend.attention"
OPS_MODULE = "dlinfer.vendor.ascend.torch_npu_ops"
FUNCTIONS = ("decode_attention", "decode_attention_mla")
# Module -> the functions that must be bound in it once it is imported (0.2.7 and later: both;
# torch_npu_ops of every known version binds both names, defined there or imported from attention).
EXPECTED: dict[str, tuple[str, ...]] = {ATTENTION_MODULE: FUNCTIONS, OPS_MODULE: FUNCTIONS}
EXPECTED_VERSIONS = "dlinfer-ascend 0.2.7 and the GitHub main branch (0.2.8)"
_MARK = "__vendor_graph_routed__"
# One wrapper per dlinfer function, so every module binding the function binds the same wrapper.
_WRAPPERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class DlinferCaptureConflict(RuntimeError):
    """dlinfer's own capture flag is set while a vendor_graph capture is running."""


def _attention_op_name(func: Any) -> str | None:
    name = getattr(func, "__name__", "") or ""
    base = name.split("::")[-1].partition(".")[0]
    return base if base in ATTENTION_OPS else None


class RouteAttention(TorchDispatchMode):
    """Sends every Ascend attention operator reached inside it through ``call_attention``."""

    def __init__(self) -> None:
        super().__init__()
        self.routed: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _attention_op_name(func)
        if name is None:
            return func(*args, **kwargs)
        self.routed.append(name)
        # This mode is off the stack while we are in here: the op reaches the next mode (torch_npu's
        # graph dispatcher, when capturing with auto dispatch) exactly as a direct call would.
        return hook.call_attention(func, *args, **kwargs)


def _dlinfer_capturing(original: Callable[..., Any]) -> bool:
    runner = getattr(original, "__globals__", {}).get("AscendGraphRunner")
    return bool(getattr(runner, "capturing", False))


def routed(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (a dlinfer decode attention function) with its attention ops routed during capture."""
    cached = _WRAPPERS.get(original)
    if cached is not None:
        return cached
    qualname = f"{getattr(original, '__module__', '?')}.{getattr(original, '__qualname__', original)}"

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if not hook.capturing():
            return original(*args, **kwargs)
        if _dlinfer_capturing(original):
            raise DlinferCaptureConflict(
                f"{qualname}: dlinfer's AscendGraphRunner.capturing is set during a vendor_graph capture; "
                f"dlinfer's runner is capturing too and would record this attention task a second time. "
                f"Build graph runners through vendor_graph only (import vendor_graph.ascend before lmdeploy)")
        with RouteAttention():
            return original(*args, **kwargs)

    setattr(wrapper, _MARK, qualname)
    _WRAPPERS[original] = wrapper
    return wrapper


def is_routed(func: Any) -> bool:
    return getattr(func, _MARK, None) is not None


def _patch_module(activation: patching.Activation, module_name: str, module: Any) -> None:
    missing = []
    for name in EXPECTED.get(module_name, FUNCTIONS):
        if any(p.owner is module and p.name == name for p in activation.patches):
            continue  # install() ran twice on this activation
        current = module.__dict__.get(name)
        if current is None or not callable(current):
            missing.append(name)
            continue
        original = getattr(current, "__wrapped__", current) if is_routed(current) else current
        if current is not original:
            # Imported by name from a module we patched already (torch_npu_ops after attention): put
            # dlinfer's function back first so this patch, too, restores exactly what dlinfer bound.
            setattr(module, name, original)
        wrapper = routed(original)
        activation.add(patching.Patch(module, name, wrapper, owner_is_module=True))
    for name in missing:
        logger.error(
            "vendor_graph.ascend: %s.%s is missing (expected in %s); dlinfer's Ascend decode attention cannot "
            "be routed through vendor_graph.npu.hook.call_attention, so graphs whose attention does not "
            "register will run eager. Check the installed dlinfer version against "
            "vendor_graph.npu.dlinfer_adapter's table", module_name, name, EXPECTED_VERSIONS)


def install(activation: patching.Activation) -> None:
    """Route dlinfer's Ascend decode attention through ``call_attention`` once its modules are imported
    (now, if they are; else right after their import). Every change is a reversible Patch on
    ``activation``; ``vendor_graph.uninstall()`` restores dlinfer's functions."""
    for module_name in EXPECTED:
        patching.when_imported(module_name, functools.partial(_patch_module, activation, module_name))
