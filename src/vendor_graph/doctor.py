"""``vendor-graph doctor``: what graph mode will find in this environment, without needing a device.

Reports the vendor runtimes present, torch and torch_npu (its graph-API generation and the seq-len
update path per attention op, from the release table: torch_npu is never imported), lmdeploy and
which vendors support it, whose methods own lmdeploy's ``CudaGraphMixin`` now (vendor_graph's,
dlinfer's or lmdeploy's own), known upstream breakages for this combination, the worker autoload
hook, and every ``VENDOR_GRAPH_*`` setting (unknown names are flagged: a typo silently does nothing).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

from . import VENDORS, __version__

KNOWN_SETTINGS: dict[str, str] = {
    "VENDOR_GRAPH_VENDOR": "vendor activated in this process and its workers",
    "VENDOR_GRAPH_DISABLE": "1: graph mode off, every step eager (buffer patches stay)",
    "VENDOR_GRAPH_DISABLE_AUTOLOAD": "1: ignore VENDOR_GRAPH_VENDOR at interpreter start",
    "VENDOR_GRAPH_ALLOW_UNSUPPORTED_LMDEPLOY": "1: activate on an unsupported lmdeploy release",
    "VENDOR_GRAPH_DEBUG": "1: detailed logs",
    "VENDOR_GRAPH_SHADOW": "N: every Nth replay also runs eager and is compared",
    "VENDOR_GRAPH_SHADOW_ACTION": "eager (default) or log: what a shadow divergence does",
    "VENDOR_GRAPH_SHADOW_TOL": "relative tolerance of the shadow comparison",
    "VENDOR_GRAPH_GUARD_WEIGHTS_EVERY": "replays between stale-weight checks (default 256, 0 off)",
    "VENDOR_GRAPH_PROGRESS": "1/0: force the capture progress bar on/off",
    "VENDOR_GRAPH_NPU_EVENT_BUDGET": "Ascend: ExternalEvents the graphs may hold",
    "VENDOR_GRAPH_SEQLEN_UPDATE": "Ascend: auto, graph-update or task-update",
}

RUNTIMES = {  # vendor -> (distribution or module that is its device runtime, what it is)
    "ascend": ("torch_npu", "torch_npu (Ascend)"),
    "camb": ("torch_mlu", "torch_mlu (Cambricon)"),
    "maca": ("dlinfer.vendor.maca", "dlinfer MACA vendor package (MetaX)"),
}


def _version(*dists: str) -> str | None:
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _findable(module: str) -> bool:
    """Whether ``module`` could be imported, without importing it (nor, for a top-level name, anything)."""
    top = module.split(".")[0]
    if importlib.util.find_spec(top) is None:
        return False
    if top == module:
        return True
    path = Path(importlib.util.find_spec(top).origin or "").parent.joinpath(*module.split(".")[1:])
    return path.is_dir() or path.with_suffix(".py").exists()


def _owner(value) -> str:
    module = getattr(getattr(value, "__func__", value), "__module__", "") or ""
    if module.startswith("vendor_graph"):
        return f"vendor_graph ({module})"
    if module.startswith("dlinfer"):
        return f"dlinfer ({module})"
    if module.startswith("lmdeploy"):
        return "lmdeploy (its own)"
    return module or "?"


def _autoload_pth() -> str:
    for key in ("purelib", "platlib"):
        pth = Path(sysconfig.get_paths()[key]) / "vendor_graph_autoload.pth"
        if pth.exists():
            return f"installed ({pth})"
    return ("NOT installed: worker processes will not activate the vendor; reinstall vendor_graph "
            "(pip install --force-reinstall vendor-graph)")


def report(vendor: str | None = None) -> tuple[list[str], int]:
    """The doctor's lines, and a count of problems found (each line with a problem starts with '!')."""
    from . import compat

    lines: list[str] = [f"vendor_graph {__version__} doctor (python {sys.version.split()[0]}, {sys.platform})"]
    problems = 0

    def add(text: str, problem: bool = False) -> None:
        nonlocal problems
        problems += problem
        lines.append(("! " if problem else "  ") + text)

    settings = {k: v for k, v in os.environ.items() if k.startswith("VENDOR_GRAPH_")}  # before any activation
    env_vendor = settings.get("VENDOR_GRAPH_VENDOR", "").strip() or None
    vendor = vendor or env_vendor

    lines.append("\nVendor runtimes")
    present = []
    for name, (module, what) in RUNTIMES.items():
        found = _findable(module)
        version = _version(module.replace("_", "-"), module) if "." not in module else None
        state = (f"installed {version}" if version else "installed") if found else "not installed"
        add(f"{name:<7} {what}: {state}")
        if found:
            present.append(name)
    dlinfer = _version("dlinfer-ascend", "dlinfer-camb", "dlinfer-maca", "dlinfer")
    add(f"dlinfer: {dlinfer or ('importable (unversioned)' if _findable('dlinfer') else 'not installed')}")
    if not present:
        add("no vendor device runtime here: graph mode can be planned and simulated (vendor-graph plan / demo), "
            "not run")

    lines.append("\ntorch")
    torch_version = _version("torch")
    add(f"torch {torch_version or 'not installed'}", problem=torch_version is None)
    npu_version = _version("torch_npu", "torch-npu")
    if npu_version is None:
        add("torch_npu not installed (Ascend only; `vendor-graph paths` lists every release's seq-len paths)")
    else:
        add(f"torch_npu {npu_version}")
        lines.extend(_torch_npu_lines(npu_version))

    lines.append("\nlmdeploy")
    version = compat.installed_lmdeploy_version()
    if version is None:
        add("lmdeploy not installed (pip install --no-deps lmdeploy==<version> to keep your vendor's torch)",
            problem=True)
    else:
        series = compat.series(version)
        supporting = [v for v in VENDORS if series in compat.SUPPORTED_SERIES[v]]
        add(f"lmdeploy {version}: vendor_graph supports it for {', '.join(supporting) or 'no vendor'}"
            + (f"; not for {', '.join(v for v in VENDORS if v not in supporting)}"
               if len(supporting) < len(VENDORS) else ""),
            problem=bool(vendor and vendor not in supporting))
        breakages = [(v, why) for (v, s), why in compat.KNOWN_BREAKAGES.items() if s == series]
        notes = _upstream_notes(version)
        lines.append("\nKnown upstream breakages for this combination")
        if not breakages and not notes:
            add("none known")
        for v, why in breakages:
            add(f"{v} on lmdeploy {series}: {why}", problem=v == vendor)
        for note in notes:
            add(note)

    lines.append("\nCudaGraphMixin owners" + (f" (after activating {vendor})" if vendor else ""))
    lines.extend(_owner_lines(vendor))

    lines.append("\nWorker processes")
    add(f"autoload hook vendor_graph_autoload.pth: {_autoload_pth()}", problem="NOT" in _autoload_pth())
    add(f"VENDOR_GRAPH_VENDOR={env_vendor}: workers activate it when lmdeploy's graph code is imported"
        if env_vendor else "VENDOR_GRAPH_VENDOR unset: workers activate nothing unless the parent imports "
        "vendor_graph.<vendor> or runs under `vendor-graph run --vendor <vendor> -- ...`")

    lines.append("\nVENDOR_GRAPH_* settings")
    if not settings:
        add("none set (all defaults)")
    for name in sorted(settings):
        if name in KNOWN_SETTINGS:
            add(f"{name}={settings[name]}  ({KNOWN_SETTINGS[name]})")
        else:
            add(f"{name}={settings[name]}: not a vendor_graph setting (a typo?); known: "
                f"{', '.join(sorted(KNOWN_SETTINGS))}", problem=True)
    lines.append(f"\n{problems} problem(s) found" if problems else "\nno problems found")
    return lines, problems


def _torch_npu_lines(version: str) -> list[str]:
    from .__main__ import seqlen_ops
    from .ascend_versions import GENERATION_FACTS, release_of
    from .npu.seqlen import path_for

    try:
        generation = release_of(version).generation
    except ValueError as exc:
        return [f"! {exc}"]
    facts = GENERATION_FACTS[generation]
    out = [f"  generation {generation}; seq-len update path per attention op:"]
    out += [f"    {name:<22} {path_for(facts, op, overload)}" for name, op, overload in seqlen_ops()]
    if generation == "G0":
        out.append("! this torch_npu has no NPUGraph API: Ascend runs eager; upgrade torch_npu for graph mode")
    return out


def _upstream_notes(version) -> list[str]:
    from packaging.version import Version

    notes = []
    if version >= Version("0.17"):
        has = _findable("dlinfer.vendor.ascend") and _findable("dlinfer.vendor.ascend.version")
        notes.append("ascend: lmdeploy >= 0.17's Ascend init() imports dlinfer.vendor.ascend.version, which no "
                     "published dlinfer (0.2.7 on PyPI, 0.2.8 on GitHub) provides"
                     + ("; the dlinfer here has it" if has else "; the dlinfer here does not have it"
                        if _findable("dlinfer") else ""))
    return notes


def _owner_lines(vendor: str | None) -> list[str]:
    from . import compat

    out = []
    if vendor:
        try:
            importlib.import_module(f"vendor_graph.{vendor}").activate()
        except Exception as exc:  # noqa: BLE001 - the doctor reports, never crashes
            out.append(f"! activating {vendor} failed: {type(exc).__name__}: {exc}")
    try:
        module = importlib.import_module(compat.CUDAGRAPH_MODULE)
    except Exception as exc:  # noqa: BLE001
        return out + [f"! lmdeploy's graph module does not import: {type(exc).__name__}: {exc}"]
    if vendor and _findable("dlinfer"):
        try:  # what a worker sees: dlinfer's lmdeploy_ext is imported by lmdeploy's vendor backend
            importlib.import_module(f"{compat.DLINFER_EXT_PREFIX}")
        except Exception as exc:  # noqa: BLE001
            out.append(f"  (dlinfer's lmdeploy_ext does not import here: {type(exc).__name__}: {exc})")
        from . import patching

        patching.ensure_owned("doctor")
        activation = patching.active()
        for target, intruder in (activation.displaced if activation is not None else []):
            who = intruder.split(".", 1)[0]
            out.append(f"  {target.rsplit('.', 1)[-1]}: {who}'s {intruder} had replaced ours; "
                       f"vendor_graph re-asserted its own")
    mixin = module.CudaGraphMixin
    for name in ("make_buffers_cudagraph", "fill_buffers_cudagraph", "update_context_cudagraph"):
        out.append(f"  {name:<26} {_owner(mixin.__dict__.get(name, getattr(mixin, name, None)))}")
    if not vendor:
        out.append("  (no vendor active in this process: `vendor-graph doctor --vendor ascend` shows what an "
                   "activated worker would hold)")
    return out


def main(vendor: str | None = None) -> int:
    lines, problems = report(vendor)
    print("\n".join(lines))
    return 1 if problems else 0
