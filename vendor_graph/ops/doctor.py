"""``vendor-graph doctor``: what graph mode will find in this environment, without needing a device.

Reports the vendor runtimes present, torch and torch_npu (its graph-API generation and the seq-len
update path per attention op, from the release table: torch_npu is never imported), lmdeploy and
which vendors support it, whose methods own lmdeploy's ``CudaGraphMixin`` now (vendor_graph's,
dlinfer's or lmdeploy's own), known upstream breakages for this combination, the worker autoload
hook, and every ``VENDOR_GRAPH_*`` setting, read by the parser activation uses (a value activation would
refuse is a problem, and so is an unknown name: a typo silently does nothing).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import sysconfig
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from .. import VENDORS, __version__
from ..config import settings
from ..install import patching
from ..install.profile import MIXIN_METHODS

# the lmdeploy modules whose calls the bridges check (vendor_graph.install.bridges)
BRIDGED_MODULES = ("lmdeploy.pytorch.engine.cache_engine", "lmdeploy.pytorch.kernels.dlinfer.pagedattention",
                   "lmdeploy.pytorch.kernels.dlinfer.flash_attention")
RUNTIMES = {  # vendor -> (distribution or module that is its device runtime, what it is)
    "ascend": ("torch_npu", "torch_npu (Ascend)"),
    "camb": ("torch_mlu", "torch_mlu (Cambricon)"),
    "maca": ("dlinfer.vendor.maca", "dlinfer MACA vendor package (MetaX)"),
}
# the simulator switch's values that name a vendor's simulated device (the others name a torch_npu)
SIMULATED_BY_NAME = ("camb", "maca")


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


@dataclass(frozen=True)
class AutoloadHook:
    """The worker autoload hook ``vendor_graph_autoload.pth``: where it is installed (None: nowhere)."""

    path: Path | None

    @property
    def installed(self) -> bool:
        return self.path is not None

    def describe(self) -> str:
        if self.path is not None:
            return f"installed ({self.path})"
        return ("NOT installed: worker processes will not activate the vendor; reinstall vendor_graph "
                "(pip install --force-reinstall vendor-graph)")


def autoload_hook() -> AutoloadHook:
    for key in ("purelib", "platlib"):
        pth = Path(sysconfig.get_paths()[key]) / "vendor_graph_autoload.pth"
        if pth.exists():
            return AutoloadHook(pth)
    return AutoloadHook(None)


def report(vendor: str | None = None) -> tuple[list[str], int]:
    """The doctor's lines, and a count of problems found (each line with a problem starts with '!')."""
    from ..upstream import compat

    lines: list[str] = [f"vendor_graph {__version__} doctor (python {sys.version.split()[0]}, {sys.platform})"]
    problems = 0

    def add(text: str, problem: bool = False) -> None:
        nonlocal problems
        problems += problem
        lines.append(("! " if problem else "  ") + text)

    readings = settings.readings()  # before any activation exports VENDOR_GRAPH_VENDOR
    vendor_reading = next((r for r in readings if r.name == settings.variable("vendor")), None)
    env_vendor = vendor_reading.value if vendor_reading is not None and vendor_reading.problem is None else None
    vendor = vendor or env_vendor

    sim_reading = next((r for r in readings if r.name == settings.SIM_SWITCH), None)
    simulated = sim_reading.value if sim_reading is not None and sim_reading.problem is None else None
    # the vendor whose device the simulator switch stands in for: camb / maca by name, else a torch_npu (Ascend)
    sim_vendor = (simulated if simulated in SIMULATED_BY_NAME else "ascend") if simulated else None
    npu_simulated = simulated if sim_vendor == "ascend" else None

    lines.append("\nVendor runtimes")
    present = []
    for name, (module, what) in RUNTIMES.items():
        if name == sim_vendor:
            add(f"{name:<7} {what}: simulated by vendor-graph-sim ({settings.SIM_SWITCH}={simulated}): a CPU "
                f"emulation, no device")
            continue
        found = _findable(module)
        version = _version(module.replace("_", "-"), module) if "." not in module else None
        state = (f"installed {version}" if version else "installed") if found else "not installed"
        add(f"{name:<7} {what}: {state}")
        if found:
            present.append(name)
    dlinfer = _version("dlinfer-ascend", "dlinfer-camb", "dlinfer-maca", "dlinfer")
    add(f"dlinfer: {dlinfer or ('importable (unversioned)' if _findable('dlinfer') else 'not installed')}")
    here = _dlinfer_generation()
    if here is not None and here.evidence:
        add(f"dlinfer generation: {here.label()} ({here.where}), by what it contains:")
        lines.extend(f"    {item}" for item in here.evidence)
        lines.append(f"    for torch_npu: {here.torch_npu()}")
    if not present:
        add("no vendor device runtime here: graph mode can be planned and simulated (vendor-graph plan / demo), "
            "not run")

    lines.append("\ntorch")
    torch_version = _version("torch")
    add(f"torch {torch_version or 'not installed'}", problem=torch_version is None)
    npu_version = _version("torch_npu", "torch-npu")
    if npu_simulated:
        add(f"torch_npu simulated ({settings.SIM_SWITCH}={npu_simulated})")
        lines.extend(_torch_npu_lines(npu_simulated))
    elif npu_version is None:
        add("torch_npu not installed (Ascend only; `vendor-graph paths` lists every release's seq-len paths)")
    else:
        add(f"torch_npu {npu_version}")
        lines.extend(_torch_npu_lines(npu_version))
    refused = _dlinfer_refusal(here, torch_version, npu_simulated or npu_version)
    if refused:
        add(f"{refused}: `import dlinfer` raises RuntimeError here; install a torch_npu it admits (above) or a "
            f"dlinfer from before PR #350", problem=True)

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
        lines.append("\nKnown upstream breakages for this combination (vendor_graph.upstream.breakages)")
        notes = _upstream_notes(series, vendor, here, on_device=bool(npu_version) and not simulated)
        if not notes:
            add("none known")
        for note, problem in notes:
            add(note, problem=problem)

    lines.append("\nCudaGraphMixin owners" + (f" (after activating {vendor})" if vendor else ""))
    lines.extend(_owner_lines(vendor))

    lines.append("\nBridges over lmdeploy/dlinfer call gaps")
    lines.extend(bridge_lines())

    lines.append("\nWorker processes")
    hook = autoload_hook()
    add(f"autoload hook vendor_graph_autoload.pth: {hook.describe()}", problem=not hook.installed)
    if vendor_reading is not None and vendor_reading.problem is not None:
        add(f"VENDOR_GRAPH_VENDOR={vendor_reading.raw!r} is not a vendor (see the settings below): workers "
            f"activate nothing")
    else:
        add(f"VENDOR_GRAPH_VENDOR={env_vendor}: workers activate it when lmdeploy's graph code is imported"
            if env_vendor else "VENDOR_GRAPH_VENDOR unset: workers activate nothing unless the parent imports "
            "vendor_graph.<vendor> or runs under `vendor-graph run --vendor <vendor> -- ...`")

    lines.append("\nCapture sizes and graph memory")
    for text, problem in capacity_lines():
        add(text, problem=problem)

    lines.append("\nVENDOR_GRAPH_* settings")
    for text, problem in settings_lines(readings):
        add(text, problem=problem)
    lines.append(f"\n{problems} problem(s) found" if problems else "\nno problems found")
    return lines, problems


def capacity_lines() -> list[tuple[str, bool]]:
    """(line, is a problem): which sizes a runner would capture and what is kept out of the KV cache for
    the graphs, from the settings and the stats file (no lmdeploy config here: lmdeploy's own
    ``cudagraph_capture_batch_sizes`` is checked against them where a runner is built)."""
    from ..sizing import capacity, planning
    from ..sizing.workload import stats_files

    try:
        current = settings.parse()
    except settings.SettingsError:
        return [("not evaluated: a setting is not accepted (see the settings below)", True)]
    out: list[tuple[str, bool]] = []
    files = stats_files(current.stats_file) if current.stats_file else []
    workload = None
    if current.stats_file:
        try:
            workload = planning.load_workload(files) if files else None
        except planning.PlanError as exc:
            out.append((f"stats file: {exc}", True))
        if workload is not None:
            out.append((f"stats file {current.stats_file}: {len(files)} file(s), {workload.decode_steps} decode steps "
                        f"of {workload.vendor} at max_batch_size {workload.max_batches}, captured sizes "
                        f"{list(workload.capture_sizes)}", False))
        elif not files:
            out.append((f"stats file {current.stats_file}: not written yet (runners write it at exit and every "
                        f"{current.stats_every or '-'} minutes)", False))
    else:
        out.append((f"no stats file ({capacity.STATS_ENV} unset): batch histograms are not kept", False))
    if current.capture_sizes is not None:
        sizes = ", ".join(map(str, current.capture_sizes))
        out.append((f"capture sizes: {sizes} ({capacity.SIZES_ENV}; max_batch_size is added; lmdeploy's "
                    f"{capacity.LMDEPLOY_SIZES}, if given, must be the same)", current.plan == "auto"))
        if current.plan == "auto":
            out.append((f"{capacity.PLAN_ENV}=auto and {capacity.SIZES_ENV} both given: runners refuse to start; "
                        f"unset one", True))
    elif current.plan == "auto":
        if workload is None:
            out.append((f"capture sizes: the vendor's default ({capacity.PLAN_ENV}=auto, and no stats to fit yet)",
                        False))
        else:
            try:
                recorded = len(workload.capture_sizes)
                plan = planning.plan_for(workload, current.plan_max_graphs or recorded)
                out.append((f"capture sizes: {plan.capture_sizes} ({capacity.PLAN_ENV}=auto at max_batch_size "
                            f"{workload.max_batches}): padded tokens {plan.padded_fraction_before:.1%} -> "
                            f"{plan.padded_fraction_after:.1%}", False))
            except planning.PlanError as exc:
                out.append((f"{capacity.PLAN_ENV}=auto: {exc}", True))
    else:
        out.append(("capture sizes: the vendor's default, or lmdeploy's cudagraph_capture_batch_sizes", False))
    try:
        reserve = capacity.reservation(workload.max_batches if workload is not None else 1, current)
        out.append((f"graph memory: {reserve.detail}"
                    + ("" if workload is not None or reserve.source != "stats file" else " (for that max_batch_size)"),
                    False))
    except capacity.CapturePlanError as exc:
        out.append((f"graph memory: {exc}", True))
    return out


def settings_lines(readings: list[settings.Reading]) -> list[tuple[str, bool]]:
    """(line, is a problem) for each variable of ``readings`` (:func:`vendor_graph.config.settings.readings`)."""
    if not readings:
        return [("none set (all defaults)", False)]
    out = []
    for r in readings:
        if r.setting is None:
            near = settings.closest(r.name)  # the name activation's warning names too
            hint = f"; did you mean {near}?" if near else ""
            out.append((f"{r.name}={r.raw}: not a vendor_graph setting (a typo?){hint}; known: "
                        f"{', '.join(sorted(settings.SETTINGS))}", True))
        elif r.problem is not None:
            out.append((str(r.problem), True))
        elif r.setting.scope == "internal":
            out.append((f"{r.name}={r.raw}  ({r.setting.meaning})", False))
        elif r.setting.scope != "runtime":
            out.append((f"{r.name}={r.raw}  ({r.setting.scope}, not read by the runtime: {r.setting.meaning})", False))
        else:
            shown = r.setting.show(r.value)
            parsed = "" if shown == r.raw else f" -> {shown}" + ("" if r.raw.strip() else " (the default)")
            out.append((f"{r.name}={r.raw}{parsed}  ({r.setting.meaning})", False))
    return out


def _torch_npu_lines(version: str) -> list[str]:
    """The seq-len update path per attention op of a torch_npu release (or a generation)."""
    from ..vendors.ascend.releases import GENERATION_FACTS, release_of
    from ..vendors.ascend.seqlen import path_for, seqlen_ops

    try:
        generation = version if version in GENERATION_FACTS else release_of(version).generation
    except ValueError as exc:
        return [f"! {exc}"]
    facts = GENERATION_FACTS[generation]
    out = [f"  generation {generation}; seq-len update path per attention op:"]
    out += [f"    {name:<22} {path_for(facts, op, overload)}" for name, op, overload in seqlen_ops()]
    if generation == "G0":
        out.append("! this torch_npu has no NPUGraph API: Ascend runs eager; upgrade torch_npu for graph mode")
    return out


def _dlinfer_generation():
    """The dlinfer generation here (read from its files, nothing imported), or None where the adapter that tells
    them apart cannot be loaded (it needs torch)."""
    try:
        from ..vendors.ascend.dlinfer_adapter import dlinfer_generation
    except ImportError:
        return None
    return dlinfer_generation()


def _dlinfer_refusal(here, torch_version: str | None, torch_npu: str | None) -> str | None:
    """Why the dlinfer here refuses this torch and torch_npu (``torch_npu``: a release, or a simulated
    generation's default release), or None."""
    from ..vendors.ascend.releases import GENERATION_FACTS, release_of

    if here is None or torch_version is None or torch_npu is None:
        return None
    if torch_npu in GENERATION_FACTS:  # the simulator switch names a generation: the release it simulates
        try:
            from vendor_graph_sim.boot import SimSwitchError, pinned_release
        except ImportError:
            return None
        try:
            torch_npu = pinned_release(torch_npu)
        except SimSwitchError:
            return None
    try:
        release = release_of(torch_npu)
    except ValueError:
        return None
    graph_api = GENERATION_FACTS[release.generation]["update"]
    return here.refusal(torch_version.split("+")[0], release.version, graph_api)


def _upstream_notes(series: str, vendor: str | None, here, on_device: bool) -> list[tuple[str, bool]]:
    """Each breakage of :data:`vendor_graph.upstream.breakages.BREAKAGES` on lmdeploy ``series`` (for
    ``vendor``, else for every vendor), with whether the dlinfer here has it and what vendor_graph does; a
    problem where it stops the chosen vendor ``on_device`` (a real torch_npu here; the simulator stands in for
    what dlinfer lacks)."""
    from ..install import bridges
    from ..upstream import breakages as upstream

    on = {b.name: bridges.allowed(b.name, _bridges_choice()) for b in bridges.BRIDGES}
    known = here.name if here is not None and here.name in upstream.DLINFERS else None
    notes = []
    for breakage in upstream.BREAKAGES:
        vendors = [v for v in breakage.vendors if breakage.applies(v, series) and vendor in (None, v)]
        if not vendors:
            continue
        text = (f"{', '.join(vendors)}: {breakage.span()}, dlinfer {' / '.join(breakage.dlinfers)}: "
                f"{breakage.what.replace('`', '')}")
        has = known is not None and known in breakage.dlinfers
        if known is not None:
            text += f"; the dlinfer here ({known}) {'has it' if has else 'does not have it'}"
        stops = breakage.blocks and (known is None or has)
        uncovered = [v for v in vendors if v not in breakage.bridged_on]
        if breakage.bridge in on:
            covered = [v for v in vendors if v in breakage.bridged_on]
            if covered:
                text += f"; on {', '.join(covered)} " + _bridge_state(breakage.bridge, on)
            if uncovered:
                text += f"; on {', '.join(uncovered)} nothing bridges it"
            stops = stops and (not on[breakage.bridge] or vendor in uncovered)
        elif breakage.does:
            text += f"; {breakage.does.replace('`', '')}"
            stops = stops and breakage.bridge is None
        notes.append((text, bool(vendor) and vendor in vendors and stops and known is not None and on_device))
    return notes


def _bridges_choice():
    try:
        return settings.parse().bridges
    except settings.SettingsError:
        return "auto"


def _bridge_state(name: str, on: dict[str, bool]) -> str:
    return (f"vendor_graph's {name} bridge adapts the call where its signature check finds it needed" if on[name]
            else f"vendor_graph's {name} bridge would adapt it, but {settings.variable('bridges')} leaves it out")


def bridge_lines() -> list[str]:
    """The bridges over upstream call gaps: each with what it fixes, and the ones installed in this process."""
    from ..install import bridges

    choice = _bridges_choice()
    installed = {}
    for record in bridges.applied():
        installed.setdefault(record.name, []).append(record.target)
    out = []
    for bridge in bridges.BRIDGES:
        if bridge.name in installed:
            state = "installed: " + ", ".join(installed[bridge.name])
        elif not bridges.allowed(bridge.name, choice):
            state = f"off ({settings.variable('bridges')})"
        else:
            state = "not needed here (lmdeploy's calls fit this dlinfer)" if patching.active() else "allowed"
        out.append(f"  {bridge.name:<18} {state}")
        out.append(f"  {'':<18} fixes: {bridge.fixes}")
    if not installed and patching.active() is None:
        out.append("  (no vendor active: each bridge checks its signatures when a vendor activates; "
                   "`vendor-graph doctor --vendor ascend` runs that check for the lmdeploy and dlinfer here)")
    return out


def _dlinfer_source_text(relative: str) -> str | None:
    """A file of the findable dlinfer package, read as text (importing dlinfer needs torch_npu)."""
    spec = importlib.util.find_spec("dlinfer") if _findable("dlinfer") else None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def _owner_lines(vendor: str | None) -> list[str]:
    from ..upstream import compat

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
            for name in BRIDGED_MODULES:  # each bridge checks its signatures as these import
                importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001
            out.append(f"  (dlinfer's lmdeploy_ext does not import here: {type(exc).__name__}: {exc})")
        patching.ensure_owned("doctor")
        activation = patching.active()
        for target, intruder in (activation.displaced if activation is not None else []):
            who = intruder.split(".", 1)[0]
            out.append(f"  {target.rsplit('.', 1)[-1]}: {who}'s {intruder} had replaced ours; "
                       f"vendor_graph re-asserted its own")
    mixin = module.CudaGraphMixin
    for name in MIXIN_METHODS:
        out.append(f"  {name:<26} {_owner(mixin.__dict__.get(name, getattr(mixin, name, None)))}")
    if not vendor:
        out.append("  (no vendor active in this process: `vendor-graph doctor --vendor ascend` shows what an "
                   "activated worker would hold)")
    return out


def main(vendor: str | None = None) -> int:
    lines, problems = report(vendor)
    print("\n".join(lines))
    return 1 if problems else 0
