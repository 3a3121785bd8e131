"""Route dlinfer's Ascend decode attention through :func:`vendor_graph.ascend.hook.call_attention`.

dlinfer's ``decode_attention`` / ``decode_attention_mla`` call the Ascend kernels directly and do graph bookkeeping
only while dlinfer's ``AscendGraphRunner.capturing`` is set; vendor_graph never sets it, so unrouted the kernels
would be captured with their host KV lengths frozen. That flag set during our capture means dlinfer's runner is
capturing too and both would record the same task: the wrapper raises.

Checked only against the simulator's stand-in (dlinfer's wheels are aarch64 and import torch_npu).
``torch_npu_ops`` imports both functions by name and looks them up as module globals per call, so every module
binding them is patched. Where each dlinfer version keeps them, and the kernels they reach:

===========================  ==========================================================================
dlinfer-ascend 0.2.7 (PyPI)  defined in ``vendor.ascend.attention``, imported into ``vendor.ascend.torch_npu_ops``;
                             ``atb._npu_paged_attention[_mla](..., context_lens=kv_seq_len, out=)``
GitHub main (0.2.8, 2026)    same; ``decode_attention`` gains ``q_seq_len`` and quantised-KV arguments and
                             defaults to ``npu.npu_fused_infer_attention_score(..., input_layout="TND",
                             actual_seq_lengths_kv=kv_seq_len)``; MLA unchanged
older GitHub revisions       both defined in ``vendor.ascend.torch_npu_ops`` (no ``attention`` module)
===========================  ==========================================================================
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
            "be routed through vendor_graph.ascend.hook.call_attention, so graphs whose attention does not "
            "register will run eager. Check the installed dlinfer version against "
            "vendor_graph.ascend.dlinfer_adapter's table", module_name, name, EXPECTED_VERSIONS)


def install(activation: patching.Activation) -> None:
    """Route dlinfer's Ascend decode attention through ``call_attention`` once its modules are imported
    (now, if they are; else right after their import). Every change is a reversible Patch on
    ``activation``; ``vendor_graph.uninstall()`` restores dlinfer's functions."""
    for module_name in EXPECTED:
        patching.when_imported(module_name, functools.partial(_patch_module, activation, module_name))
