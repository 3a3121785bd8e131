"""The ``vendor-graph`` commands, each a function of the parsed arguments that returns the exit status
(:mod:`vendor_graph.ops.cli` builds the parser and runs them).

``doctor``: what graph mode finds here (runtimes, torch / torch_npu and its seq-len paths, lmdeploy and
its support, who owns lmdeploy's CudaGraphMixin, known upstream breakages, VENDOR_GRAPH_* settings).

``run --vendor V -- <command ...>``: run an lmdeploy command (any command) with vendor V active in it
and in every worker process it starts (``VENDOR_GRAPH_VENDOR``, honoured by the autoload hook).

``paths``: the torch_npu release -> seq-len update path table.

``plan``: activate a vendor in the real lmdeploy installed here and print what graph mode will do:
patch status (whose methods own lmdeploy's CudaGraphMixin now), the capture sizes and the padding
they cost, the buffers the vendor binds on this lmdeploy release, and a self-check of those buffers
run through lmdeploy's mixin.

``plan --from-stats FILE [FILE ...] [--max-graphs N] [--capture-sizes S ...] [--json]``: fit capture sizes
to the decode steps recorded in stats files (``VENDOR_GRAPH_STATS_FILE``; one per rank, or several runs):
at most N graphs (default: as many as the recorded run captured) that pad the fewest tokens, holding the
given sizes, and the padding before and after. Needs neither torch nor lmdeploy and activates nothing.
``--json`` prints the plan as one JSON object, a file ``VENDOR_GRAPH_CAPTURE_SIZES`` accepts.

A command raises :class:`UsageError` for a command line that cannot run as given.
"""

from __future__ import annotations

import argparse
import bisect
import importlib
import os
import sys

from .. import __version__, vendors
from ..install import patching

OP_BACKEND_HINT = {
    "ascend": "lmdeploy's Ascend op backend imports dlinfer, which is not importable here",
}


class UsageError(Exception):
    """A command line that cannot run as given: :func:`vendor_graph.ops.cli.main` prints it as one line on stderr,
    exit status 2."""

    def __init__(self, message: str, prog: str | None = None):
        super().__init__(message)
        self.prog = prog


def _table(rows: list[dict[str, str]]) -> str:
    if not rows:
        return "(none)"
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols), "  ".join("-" * widths[c] for c in cols)]
    lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(lines)


def _capture_rows(sizes: list[int]) -> list[dict[str, str]]:
    rows, low = [], 1
    for size in sizes:
        served = range(low, size + 1)
        mean_waste = sum(size - b for b in served) / (len(served) * size)
        worst = (size - low) / size
        rows.append({"graph batch": str(size), "serves batches": f"{low}-{size}" if low < size else str(size),
                     "worst padding": f"{worst:.0%}", "mean padding": f"{mean_waste:.0%}"})
        low = size + 1
    return rows


def plan_sizes(vendor: str, max_batches: int, explicit: list[int] | None) -> tuple[list[int], str | None]:
    """The capture sizes ``plan`` shows, and a note on how lmdeploy normalises explicit sizes (None: as given)."""
    profile = vendors.profile(vendor)
    if explicit is None:
        return profile.capture_sizes(max_batches), None
    given = " ".join(map(str, explicit))
    if min(explicit) > max_batches:
        raise UsageError(f"--capture-sizes {given}: every size is above --max-batches {max_batches}, so lmdeploy "
                         f"refuses them; give at least one size <= {max_batches} (sizes above it are dropped)")
    sizes = profile.capture_sizes(max_batches, explicit)
    changes = _normalisation(explicit, max_batches)
    note = f"--capture-sizes {given} normalised as lmdeploy does: {'; '.join(changes)}" if changes else None
    return sizes, note


def _normalisation(explicit: list[int], max_batches: int) -> list[str]:
    """What lmdeploy's normalisation changes in ``explicit`` (at least one size <= ``max_batches``)."""
    changes = []
    if explicit != sorted(explicit):
        changes.append("sorted")
    if len(set(explicit)) < len(explicit):
        changes.append("repeats removed")
    dropped = sorted({s for s in explicit if s > max_batches})
    if dropped:
        changes.append(f"{', '.join(map(str, dropped))} dropped (above max_batch_size {max_batches})")
    if max(s for s in explicit if s <= max_batches) != max_batches:
        changes.append(f"max_batch_size {max_batches} added (always captured)")
    return changes


def runtime_sizes(vendor: str, max_batches: int, explicit: list[int] | None,
                  sizes: list[int]) -> tuple[list[int], str, str | None]:
    """The sizes a runner built here would capture (``VENDOR_GRAPH_CAPTURE_SIZES`` and ``VENDOR_GRAPH_PLAN``
    included, as :func:`vendor_graph.sizing.capacity.resolve_capture_plan` reads them where the runner is built), the
    rule that chose them and a note; ``sizes``: what ``plan_sizes`` gave for the command line alone.
    A setting the runner would refuse is refused here (CapturePlanError: exit status 2)."""
    from ..config import settings
    from ..sizing import capacity

    current = settings.load()
    runtime = capacity.resolve_capture_plan(vendor, max_batches, vendors.profile(vendor).capture_sizes(max_batches),
                                            explicit, current=current, quiet=True)
    if runtime.source == capacity.EXPLICIT_LMDEPLOY:
        return sizes, "explicit cudagraph_capture_batch_sizes", None
    if runtime.source == capacity.EXPLICIT_ENV:
        given = list(current.capture_sizes)
        changes = _normalisation(given, max_batches)
        note = (f"{capacity.SIZES_ENV}={','.join(map(str, given))} normalised as lmdeploy does: {'; '.join(changes)}"
                if changes else None)
        return list(runtime.sizes), f"{capacity.SIZES_ENV} (what the runtime captures)", note
    if runtime.source == capacity.AUTO:
        return list(runtime.sizes), f"{capacity.PLAN_ENV}=auto (fitted to {capacity.STATS_ENV})", runtime.note
    rule = "three-tier Ascend rule" if vendor == "ascend" else "lmdeploy CUDA runner rule"
    return list(runtime.sizes), rule, runtime.note


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _tokens(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def _fitted_rows(weights: dict[int, int], steps: dict[int, int], sizes: list[int]) -> list[dict[str, str]]:
    rows, low = [], 1
    batches = sorted(steps)
    for size in sizes:  # one pass over the batches, however many sizes (a plan may hold a graph per batch)
        served = batches[bisect.bisect_left(batches, low):bisect.bisect_right(batches, size)]
        padded = sum(weights.get(b, 0) * (size - b) for b in served)
        rows.append({"graph batch": str(size), "serves batches": f"{low}-{size}" if low < size else str(size),
                     "steps served": str(sum(steps[b] for b in served)), "padded tokens": _tokens(padded)})
        low = size + 1
    return rows


def cmd_plan_from_stats(args: argparse.Namespace) -> int:
    import json

    from ..sizing import planning

    for flag, value in (("--vendor", args.vendor), ("--max-batches", args.max_batches)):
        if value is not None:
            raise UsageError(f"{flag} cannot be given with --from-stats: the stats files carry the vendor and "
                             f"max_batch_size they were recorded with; leave {flag} out")
    workload = planning.load_workload(args.from_stats)
    max_graphs = len(workload.capture_sizes) if args.max_graphs is None else args.max_graphs
    plan = planning.plan_for(workload, max_graphs, args.capture_sizes or ())
    before = sorted(workload.capture_sizes)
    if args.json:
        print(json.dumps({"capture_sizes": plan.capture_sizes, "padded_fraction_before": plan.padded_fraction_before,
                          "padded_fraction_after": plan.padded_fraction_after,
                          "padded_tokens_before": plan.padded_tokens_before,
                          "padded_tokens_after": plan.padded_tokens_after, "max_graphs": plan.max_graphs,
                          "vendor": workload.vendor, "max_batches": workload.max_batches,
                          "files": list(workload.files), "notes": list(plan.notes)}, indent=2))
        return 0
    print(f"vendor_graph {__version__} plan from stats: vendor {workload.vendor!r}, max_batches "
          f"{workload.max_batches}")
    print(f"read {_count(len(workload.files), 'file')} ({workload.decode_steps} decode steps, query lengths "
          f"{', '.join(map(str, workload.query_lens))}): {', '.join(workload.files)}")
    required = f", holding {' '.join(map(str, sorted(set(args.capture_sizes))))}" if args.capture_sizes else ""
    print(f"\nFitted capture sizes: {_count(len(plan.capture_sizes), 'graph')} (at most {plan.max_graphs}{required})")
    print(_table(_fitted_rows(workload.weights, workload.steps, plan.capture_sizes)))
    print(f"\npadded tokens: before {_tokens(plan.padded_tokens_before)} ({plan.padded_fraction_before:.1%} of graph "
          f"tokens, sizes {before}) -> after {_tokens(plan.padded_tokens_after)} "
          f"({plan.padded_fraction_after:.1%})")
    for note in plan.notes:
        print(f"note: {note}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    if args.from_stats:
        return cmd_plan_from_stats(args)
    for flag, value in (("--max-graphs", args.max_graphs), ("--json", args.json or None)):
        if value is not None:
            raise UsageError(f"{flag} plans from recorded stats: give it with --from-stats FILE (written with "
                             f"VENDOR_GRAPH_STATS_FILE=FILE while the workload runs)")
    from ..upstream import compat

    vendor = args.vendor or "ascend"
    args.max_batches = args.max_batches or 256
    sizes, sizes_note = plan_sizes(vendor, args.max_batches, args.capture_sizes)
    sizes, rule, runtime_note = runtime_sizes(vendor, args.max_batches, args.capture_sizes, sizes)
    print(f"vendor_graph {__version__} plan for vendor {vendor!r}")
    version = compat.installed_lmdeploy_version()
    import torch

    print(f"torch {torch.__version__}; lmdeploy {version or 'not installed'}; "
          f"{vendor} supports lmdeploy {', '.join(s + '.x' for s in compat.SUPPORTED_SERIES[vendor])}")
    module = importlib.import_module(f"vendor_graph.{vendor}")
    module.activate()

    from lmdeploy.pytorch.models.utils.cudagraph import CudaGraphMixin  # noqa: F401  (patch lands now)

    profile = module.PROFILE
    try:
        importlib.import_module(profile.op_backend_module)
    except ImportError as exc:
        hint = OP_BACKEND_HINT.get(vendor, "its op backend failed to import")
        print(f"\nnote: {hint} ({exc}); its build_graph_runner is patched when it is imported")
    patching.ensure_owned("plan")
    activation = patching.active()

    print("\nPatches in force")
    rows = [{"target": p.target.replace("lmdeploy.pytorch.", "…"), "owner now": patching.describe(p.current()),
             "ours": "yes" if p.owned() else "NO", "replaced": patching.describe(p.before)}
            for p in activation.patches]
    print(_table(rows))

    print(f"\nCapture plan: max_batch_size {args.max_batches}, {rule}: {len(sizes)} graphs, captured largest first")
    for note in (sizes_note, runtime_note):
        if note:
            print(f"note: {note}")
    print(_table(_capture_rows(sizes)))

    spec = profile.spec
    print(f"\nBuffers bound on lmdeploy {compat.lmdeploy_api().version} ({len(spec.fields)} fields)")
    print(_table(spec.describe()))
    if spec.constants:
        print("constants set on every fill: " + ", ".join(f"attn_metadata.{n}" for n in spec.constants))

    from . import selfcheck

    report = selfcheck.run(spec, graph_batch=min(16, sizes[-1]))
    verdict = "PASS" if report.ok else "FAIL: stale " + "; ".join(report.stale)
    print(f"\nSelf-check through lmdeploy's CudaGraphMixin: graph batch {report.graph_batch}, live batches "
          f"{report.batches}, {report.copies_per_step} copies per step; buffers equal a fresh fill after "
          f"every step: {verdict}")
    return 0 if report.ok else 1


def cmd_paths(args: argparse.Namespace) -> int:
    from ..vendors.ascend.seqlen import seqlen_path_table

    print(seqlen_path_table())
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from . import doctor

    return doctor.main(args.vendor)


RUN_EXAMPLE = "vendor-graph run --vendor ascend -- lmdeploy serve api_server <model> --backend pytorch --device ascend"


def _check_runnable(command: list[str], env: dict[str, str]) -> None:
    """:class:`UsageError` naming the command and the fix where exec could not start it, found the way
    ``os.execvpe`` looks (a name with a ``/`` as a path, else each directory of the environment's PATH)."""
    name = command[0]
    if not name:
        raise UsageError(f"the command name is empty (vendor-graph run ... -- ''): give the program to run "
                         f"after --, e.g. {RUN_EXAMPLE}")
    for i, arg in enumerate(command):
        if "\0" in arg:
            what = "the command name" if i == 0 else f"argument {i} of {name!r}"
            raise UsageError(f"{what} ({arg!r}) holds a NUL byte, which no program can be given: remove it")
    if os.sep in name or (os.altsep and os.altsep in name):
        if not os.path.exists(name):
            where = "" if os.path.isabs(name) else f" (relative to {os.getcwd()})"
            raise UsageError(f"{name!r} does not exist: check the path{where}")
        if os.path.isdir(name):
            raise UsageError(f"{name!r} is a directory, not a command: give the program inside it to run")
        if not os.access(name, os.X_OK):
            raise UsageError(f"{name!r} is not executable: chmod +x {name}, or run it through its interpreter "
                             f"(vendor-graph run --vendor ... -- python {name} ...)")
        return
    unrunnable = None
    for folder in os.get_exec_path(env):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            if os.access(path, os.X_OK):
                return
            unrunnable = unrunnable or path
    if unrunnable is not None:
        raise UsageError(f"{name!r} on PATH ({unrunnable}) is not executable: chmod +x {unrunnable}, or run it "
                         f"through its interpreter (vendor-graph run --vendor ... -- python {unrunnable} ...)")
    raise UsageError(f"{name!r} not found on PATH: install it in this environment (or activate the one that has "
                     f"it), or give its path")


def cmd_run(args: argparse.Namespace) -> int:
    """Replace this process with ``args.cmd``, vendor active in it and every process it starts.

    ``os.execvpe`` replaces this process, so the command keeps its pid: SIGINT and SIGTERM sent to
    ``vendor-graph run`` (Ctrl-C, a supervisor's stop) reach the command itself, and its exit status is
    this process's. Before the exec, one line on stderr says what is armed; a command that cannot be
    started (not found, a directory, not executable, an empty name, a NUL byte, or exec refusing it) is a
    :class:`UsageError`: exit status 2 and one line naming the command and the fix.
    """
    from ..config.settings import SIM_SWITCH
    from ..install.patching import VENDOR_ENV

    command = list(args.cmd)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError(f"nothing to run; usage: {RUN_EXAMPLE}")
    env = dict(os.environ)
    env[VENDOR_ENV] = args.vendor
    if env.pop("VENDOR_GRAPH_DISABLE_AUTOLOAD", None) is not None:
        print("vendor-graph run: ignoring VENDOR_GRAPH_DISABLE_AUTOLOAD for this command (it would keep the "
              "vendor off)", file=sys.stderr)
    from .doctor import autoload_hook

    hook = autoload_hook()
    if not hook.installed:
        raise UsageError(f"the autoload hook is {hook.describe()}")
    _check_runnable(command, env)
    simulated = env.get(SIM_SWITCH, "").strip()
    print(f"vendor-graph run: {args.vendor} graph mode armed for lmdeploy in {command[0]!r} and the processes it "
          f"starts ({VENDOR_ENV}={args.vendor}, read by the autoload hook {hook.path.name}"
          + (f"; simulated NPU: {SIM_SWITCH}={simulated})" if simulated else ")"), file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)
    except (OSError, ValueError) as exc:  # what the checks above could not foresee (a binary of another machine)
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UsageError(f"{command[0]!r} could not be started: {reason}: give a program this machine can run "
                         f"(a script needs a #! line and chmod +x)") from None
    return 0  # pragma: no cover - execvpe does not return
