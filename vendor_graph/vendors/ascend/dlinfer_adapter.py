"""Route dlinfer's Ascend decode attention through :func:`vendor_graph.vendors.ascend.hook.call_attention`.

dlinfer's ``decode_attention`` / ``decode_attention_mla`` call the Ascend kernels directly and do graph bookkeeping
only while dlinfer's ``AscendGraphRunner.capturing`` is set; vendor_graph never sets it, so unrouted the kernels
would be captured with their host KV lengths frozen. That flag set during our capture means dlinfer's runner is
capturing too and both would record the same task: the wrapper raises.

Checked against the real dlinfer main (a50184e) on the simulated NPU (tests/realstack) and the simulator's
stand-in. ``torch_npu_ops`` imports both functions by name and looks them up as module globals per call, so
every module binding them is patched. Where each dlinfer version keeps them, and the kernels they reach:

===========================  ==========================================================================
dlinfer-ascend 0.2.7 (PyPI)  defined in ``vendor.ascend.attention``, imported into ``vendor.ascend.torch_npu_ops``;
                             ``atb._npu_paged_attention[_mla](..., context_lens=kv_seq_len, out=)``
GitHub main (0.2.8, 2026)    same; ``decode_attention`` gains ``q_seq_len`` and quantised-KV arguments and
                             defaults to ``npu.npu_fused_infer_attention_score(..., input_layout="TND",
                             actual_seq_lengths_kv=kv_seq_len)``; MLA unchanged
older GitHub revisions       both defined in ``vendor.ascend.torch_npu_ops`` (no ``attention`` module)
===========================  ==========================================================================

Also: dlinfer's MoE ``apply_mlp`` (more than 1024 experts) takes its host-sync-free path during a vendor_graph
capture, as under dlinfer's own capture flag; and dlinfer-ascend 0.2.7, which cannot decode with lmdeploy
0.16-0.18 at all, is refused at activation (:func:`check_installed`).
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Callable
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

from ... import patching
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


# dlinfer-ascend releases whose paged_decode_attention has no q_seq_len: lmdeploy 0.16-0.18 pass q_seqlens
# positionally, so their first decode attention raises TypeError ("multiple values for argument 'head_size_v'").
FIRST_COMPATIBLE = "0.2.8"
DISTRIBUTIONS = ("dlinfer-ascend", "dlinfer_ascend", "dlinfer")


class DlinferIncompatible(ImportError):
    """The installed dlinfer cannot decode with the supported lmdeploy releases."""


def installed_dlinfer() -> tuple[str, str] | None:
    """(distribution, version) of the installed dlinfer, from package metadata (nothing is imported)."""
    from importlib import metadata

    for dist in DISTRIBUTIONS:
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def incompatibility(version: str) -> str | None:
    """Why dlinfer ``version`` cannot serve lmdeploy 0.16-0.18 decode, or None."""
    from packaging.version import InvalidVersion, Version

    try:
        if Version(version) >= Version(FIRST_COMPATIBLE):
            return None
    except InvalidVersion:
        return None
    return (f"dlinfer {version} cannot decode with lmdeploy 0.16-0.18: its paged_decode_attention takes no "
            f"q_seq_len, so lmdeploy's first decode attention raises TypeError (\"multiple values for argument "
            f"'head_size_v'\"), eager or graph. Fix: install dlinfer {FIRST_COMPATIBLE} or later (its GitHub main "
            f"branch: DEVICE=ascend pip install git+https://github.com/DeepLink-org/dlinfer.git)")


def check_installed() -> None:
    """Refuse activation on a dlinfer that cannot decode at all (:class:`DlinferIncompatible`)."""
    found = installed_dlinfer()
    if found is None:
        return
    problem = incompatibility(found[1])
    if problem is not None:
        raise DlinferIncompatible(f"vendor_graph.ascend: {found[0]} {found[1]} is installed. {problem}")


def _decode_signature_problem(module: Any) -> str | None:
    import inspect

    fn = module.__dict__.get("paged_decode_attention")
    try:
        params = inspect.signature(fn).parameters if fn is not None else {}
    except (TypeError, ValueError):
        return None
    if params and "q_seq_len" not in params:
        return incompatibility("0.2.7")
    return None


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
    if module_name == OPS_MODULE:
        problem = _decode_signature_problem(module)
        if problem is not None:  # a source install without metadata: said where it is found
            logger.error("vendor_graph.ascend: %s.paged_decode_attention has no q_seq_len: %s", module_name, problem)
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
            "be routed through vendor_graph.vendors.ascend.hook.call_attention, so graphs whose attention does not "
            "register will run eager. Check the installed dlinfer version against "
            "vendor_graph.vendors.ascend.dlinfer_adapter's table", module_name, name, EXPECTED_VERSIONS)


MOE_MODULE = "dlinfer.vendor.ascend.moe"
# dlinfer's switch to the MoE path without host syncs (for more experts than one grouped matmul takes); its
# own graph runner's capture flag selects that path too, and vendor_graph's capture must as well.
MOE_CAPTURABLE_SWITCH = "_MOE_PREFILL_USE_CATCHALL"


def _capturable_moe(original: Callable[..., Any], module: Any) -> Callable[..., Any]:
    @functools.wraps(original)
    def apply_mlp(*args, **kwargs):
        if not hook.capturing():
            return original(*args, **kwargs)
        # The row-slicing path reads expert counts on the host (.tolist()), which cannot be captured.
        saved = getattr(module, MOE_CAPTURABLE_SWITCH)
        setattr(module, MOE_CAPTURABLE_SWITCH, True)
        try:
            return original(*args, **kwargs)
        finally:
            setattr(module, MOE_CAPTURABLE_SWITCH, saved)

    setattr(apply_mlp, _MARK, f"{MOE_MODULE}.apply_mlp")
    return apply_mlp


def _patch_moe(activation: patching.Activation, module: Any) -> None:
    current = module.__dict__.get("apply_mlp")
    if current is None or not hasattr(module, MOE_CAPTURABLE_SWITCH):
        logger.warning("vendor_graph.ascend: %s has no apply_mlp / %s (a dlinfer other than %s): its MoE path for "
                       "more than 1024 experts is not made capturable", MOE_MODULE, MOE_CAPTURABLE_SWITCH,
                       EXPECTED_VERSIONS)
        return
    if is_routed(current) or any(p.owner is module and p.name == "apply_mlp" for p in activation.patches):
        return
    activation.add(patching.Patch(module, "apply_mlp", _capturable_moe(current, module), owner_is_module=True))


def install(activation: patching.Activation) -> None:
    """Route dlinfer's Ascend decode attention through ``call_attention`` once its modules are imported
    (now, if they are; else right after their import). Every change is a reversible Patch on
    ``activation``; ``vendor_graph.uninstall()`` restores dlinfer's functions."""
    for module_name in EXPECTED:
        patching.when_imported(module_name, functools.partial(_patch_module, activation, module_name))
    patching.when_imported(MOE_MODULE, functools.partial(_patch_moe, activation))
