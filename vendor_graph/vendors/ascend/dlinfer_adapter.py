"""Route dlinfer's Ascend decode attention through :func:`vendor_graph.vendors.ascend.hook.call_attention`.

dlinfer's ``decode_attention`` / ``decode_attention_mla`` call the Ascend kernels directly, captured by its own
runner only while its ``AscendGraphRunner.capturing`` is set; vendor_graph never sets that flag, so unrouted the
kernels would be captured with their host KV lengths frozen (and that flag set during our capture raises).
Which dlinfer generation is installed (:func:`dlinfer_generation`), where each keeps those functions and what
they call: ``docs/upstream.md`` (dlinfer generations). dlinfer-ascend 0.2.7 is refused at activation.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import logging
import sys
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

from ...install import patching
from ...upstream.breakages import A50184E_ERA, POST_350
from . import hook
from .seqlen import ATTENTION_OPS

logger = logging.getLogger("vendor_graph")

ATTENTION_MODULE = "dlinfer.vendor.ascend.attention"
OPS_MODULE = "dlinfer.vendor.ascend.torch_npu_ops"
FUNCTIONS = ("decode_attention", "decode_attention_mla")
# Module -> the functions that must be bound in it once it is imported (0.2.7 and later: both;
# torch_npu_ops of every known version binds both names, defined there or imported from attention).
EXPECTED: dict[str, tuple[str, ...]] = {ATTENTION_MODULE: FUNCTIONS, OPS_MODULE: FUNCTIONS}
EXPECTED_VERSIONS = "dlinfer-ascend 0.2.7 and the GitHub main branch (0.2.8: a50184e and after PR #350)"
CUDAGRAPH_MODULE = "dlinfer.framework.lmdeploy_ext.cudagraph.ascend_cudagraph"
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


# -- which dlinfer generation is here, by what it contains -----------------------------------------------------

VERSION_MODULE = "dlinfer.vendor.ascend.version"
# ensure_ascend_runtime()'s rule, run at ``import dlinfer`` by a post-#350 dlinfer (docs/upstream.md)
POST_350_MIN_TORCH = "2.8.0"
POST_350_MIN_TORCH_NPU = "2.8.0.post1"
A50184E_TORCH_NPU_PINS = ">=2.3.1,<2.10.0"  # what an a50184e-era dlinfer requires (docs/upstream.md)
_SOURCES = {CUDAGRAPH_MODULE: "framework/lmdeploy_ext/cudagraph/ascend_cudagraph.py",
            VERSION_MODULE: "vendor/ascend/version.py", ATTENTION_MODULE: "vendor/ascend/attention.py"}


@dataclasses.dataclass(frozen=True)
class _Contents:
    names: frozenset[str]  # what the module binds at top level
    runner_params: tuple[str, ...] | None  # AscendGraphRunner.__init__'s parameters, where it defines the class


def _package_root() -> Path | None:
    """The folder of the dlinfer package this process imported or would import (nothing is imported)."""
    live = sys.modules.get("dlinfer")
    paths = list(getattr(live, "__path__", None) or []) if live is not None else []
    if not paths:
        try:
            spec = importlib.util.find_spec("dlinfer")
        except (ImportError, ValueError):
            spec = None
        paths = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(paths[0]) if paths else None


def _contents(module_name: str, root: Path | None) -> _Contents | None:
    """What ``module_name`` binds: the imported module's namespace when it was imported from a file, else its
    source under ``root`` read without importing it (``import dlinfer`` needs torch_npu, and a post-#350 one
    refuses most of them); None where neither exists."""
    import inspect

    live = sys.modules.get(module_name)
    if live is not None and getattr(live, "__file__", None):  # (a stand-in without a file says nothing)
        runner = vars(live).get("AscendGraphRunner")
        params = None
        if isinstance(runner, type) and runner.__module__ == module_name:
            try:
                params = tuple(inspect.signature(runner.__init__).parameters)
            except (TypeError, ValueError):
                params = None
        return _Contents(frozenset(vars(live)), params)
    if root is None:
        return None
    try:
        tree = ast.parse((root / _SOURCES[module_name]).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    names: set[str] = set()
    params = None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        if isinstance(node, ast.ClassDef) and node.name == "AscendGraphRunner":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    a = item.args
                    params = tuple(p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs))
    return _Contents(frozenset(names), params)


def _refused_releases(minimum: str) -> tuple[list[str], list[str]]:
    """(generations every known release of which is below ``minimum``, the releases below it of the others)."""
    from packaging.version import InvalidVersion, Version

    from .releases import GENERATIONS, RELEASES

    below: dict[str, list[str]] = {}
    every: dict[str, int] = {}
    for release in RELEASES:
        every[release.generation] = every.get(release.generation, 0) + 1
        try:
            if Version(release.version) < Version(minimum):
                below.setdefault(release.generation, []).append(release.version)
        except InvalidVersion:
            continue
    whole = [g for g in GENERATIONS if g in below and len(below[g]) == every[g]]
    partly = [f"{v} ({g})" for g in GENERATIONS if g in below and g not in whole for v in below[g]]
    return whole, partly


@dataclasses.dataclass(frozen=True)
class DlinferGeneration:
    """Which dlinfer generation this process would run, recognised by content (:func:`dlinfer_generation`)."""

    name: str | None  # A50184E_ERA, POST_350, or None: no dlinfer here, or one neither describes
    where: str  # the package folder read, or why there is none
    evidence: tuple[str, ...]

    def label(self) -> str:
        if self.name is not None:
            return self.name
        return "none" if not self.evidence else "unrecognised (neither a50184e-era nor post-#350)"

    def torch_npu(self) -> str:
        """What this generation means for the torch_npu wheels it can run on."""
        if self.name == POST_350:
            whole, partly = _refused_releases(POST_350_MIN_TORCH_NPU)
            return (f"`import dlinfer` raises RuntimeError (vendor/ascend/version.py ensure_ascend_runtime) unless "
                    f"torch >= {POST_350_MIN_TORCH}, torch_npu >= {POST_350_MIN_TORCH_NPU} of torch's own "
                    f"major.minor, and a callable torch.npu.NPUGraph.update: it refuses every wheel of "
                    f"{', '.join(whole)}, and "
                    f"{', '.join(partly)}; and any torch_npu whose major.minor differs from torch's. Its requirements "
                    f"cap torch and torch-npu below 2.10")
        if self.name == A50184E_ERA:
            return (f"imports on the torch_npu its pins admit (torch-npu{A50184E_TORCH_NPU_PINS}) that has "
                    f"torch.npu.ExternalEvent (G1 and later; a G0 wheel fails at import); its own runner refreshes "
                    f"FIA lengths by NPUGraph.update from torch_npu {POST_350_MIN_TORCH_NPU} on, and below that "
                    f"captures ATB paged attention in task groups (GraphParams) and refuses multi-token decode graphs")
        if not self.evidence:
            return "no dlinfer here: nothing refuses a torch_npu wheel"
        return "unknown (a dlinfer neither generation describes: see the evidence)"

    def refusal(self, torch_version: str, torch_npu_version: str, graph_api: bool = True) -> str | None:
        """Why this dlinfer's import refuses torch ``torch_version`` with torch_npu ``torch_npu_version`` (a
        release string, pre-releases included), or None. ``graph_api``: whether that torch_npu has a callable
        ``NPUGraph.update`` (G2a and later)."""
        from packaging.version import InvalidVersion, Version

        if self.name != POST_350:
            return None
        try:
            torch_v, npu_v = Version(torch_version), Version(torch_npu_version)
        except InvalidVersion as exc:
            return f"post-#350 dlinfer refuses an unparsable version: {exc}"
        if torch_v < Version(POST_350_MIN_TORCH):
            return f"post-#350 dlinfer refuses torch {torch_version} (needs >= {POST_350_MIN_TORCH})"
        if npu_v < Version(POST_350_MIN_TORCH_NPU):
            return f"post-#350 dlinfer refuses torch_npu {torch_npu_version} (needs >= {POST_350_MIN_TORCH_NPU})"
        if torch_v.release[:2] != npu_v.release[:2]:
            return (f"post-#350 dlinfer refuses torch {torch_version} with torch_npu {torch_npu_version} (their "
                    f"major.minor must be the same)")
        if not graph_api:
            return f"post-#350 dlinfer refuses torch_npu {torch_npu_version}: no callable NPUGraph.update"
        return None


def dlinfer_generation() -> DlinferGeneration:
    """The dlinfer generation here, recognised by what its modules contain (never a version string): the
    a50184e-era (``ascend_cudagraph.GraphParams``: the task-group ATB path; no ``vendor.ascend.version``) or
    post-#350 (``vendor.ascend.version.ensure_ascend_runtime``, no ``GraphParams``, ``AscendGraphRunner`` takes
    ``is_mla``). Reads the imported modules, else their source (nothing is imported)."""
    root = _package_root()
    if root is None:
        return DlinferGeneration(None, "no dlinfer package found", ())
    cudagraph = _contents(CUDAGRAPH_MODULE, root)
    version = _contents(VERSION_MODULE, root)
    attention = _contents(ATTENTION_MODULE, root)
    if cudagraph is None and version is None:
        return DlinferGeneration(None, str(root), (f"{CUDAGRAPH_MODULE} and {VERSION_MODULE} not found",))
    runtime_check = version is not None and "ensure_ascend_runtime" in version.names
    graph_params = cudagraph is not None and "GraphParams" in cudagraph.names
    is_mla = cudagraph is not None and "is_mla" in (cudagraph.runner_params or ())
    evidence = (
        f"{VERSION_MODULE}.ensure_ascend_runtime: {'present' if runtime_check else 'absent'}",
        f"{CUDAGRAPH_MODULE}.GraphParams: {'present' if graph_params else 'absent'}",
        f"AscendGraphRunner takes is_mla: {'yes' if is_mla else 'no'}",
        f"{ATTENTION_MODULE} binds AscendGraphRunner: "
        f"{'yes' if attention is not None and 'AscendGraphRunner' in attention.names else 'no'}",
    )
    if runtime_check and not graph_params and is_mla:
        name = POST_350
    elif graph_params and not runtime_check:
        name = A50184E_ERA
    else:
        name = None
    return DlinferGeneration(name, str(root), evidence)


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
    """Whether dlinfer's own runner is capturing: ``AscendGraphRunner.capturing``, as the attention module binds
    it (a50184e-era) or where it lives (``ascend_cudagraph``; a post-#350 ``attention`` no longer imports it)."""
    bound = getattr(original, "__globals__", {}).get("AscendGraphRunner")
    home = getattr(sys.modules.get(CUDAGRAPH_MODULE), "AscendGraphRunner", None)
    return any(bool(getattr(runner, "capturing", False)) for runner in (bound, home) if runner is not None)


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
