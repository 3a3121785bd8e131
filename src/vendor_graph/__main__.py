"""``vendor-graph`` / ``python -m vendor_graph``: command-line entry points.

``doctor``: what graph mode finds here (runtimes, torch / torch_npu and its seq-len paths, lmdeploy and
its support, who owns lmdeploy's CudaGraphMixin, known upstream breakages, VENDOR_GRAPH_* settings).

``run --vendor V -- <command ...>``: run an lmdeploy command (any command) with vendor V active in it
and in every worker process it starts (``VENDOR_GRAPH_VENDOR``, honoured by the autoload hook).

``demo`` (the README's main job): the tiny decoder on the CPU graph simulator, eager and graph side by
side, with the parity verdict and the runner's stats. Where a real torch_npu is installed, the
simulator runs in a child process with torch's device-backend autoload off.

``paths``: the torch_npu release -> seq-len update path table.

``plan``: activate a vendor in the real lmdeploy installed here and print what graph mode will do:
patch status (whose methods own lmdeploy's CudaGraphMixin now), the capture sizes and the padding
they cost, the buffers the vendor binds on this lmdeploy release, and a self-check of those buffers
run through lmdeploy's mixin.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import subprocess
import sys

from . import VENDORS, __version__

OP_BACKEND_HINT = {
    "ascend": "lmdeploy's Ascend op backend imports dlinfer, which is not importable here",
}


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


def cmd_plan(args: argparse.Namespace) -> int:
    from . import buckets, compat, patching

    vendor = args.vendor
    print(f"vendor_graph {__version__} plan for vendor {vendor!r}")
    version = compat.installed_lmdeploy_version()
    import torch

    print(f"torch {torch.__version__}; lmdeploy {version or 'not installed'}; "
          f"{vendor} supports lmdeploy {', '.join(s + '.x' for s in compat.SUPPORTED_SERIES[vendor])}")
    try:
        module = importlib.import_module(f"vendor_graph.{vendor}")
        module.activate()
    except compat.UnsupportedLmdeploy as exc:
        print(f"\nNOT ACTIVE: {exc}")
        return 2

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

    sizes = buckets.capture_sizes(vendor, args.max_batches, args.capture_sizes)
    rule = "explicit cudagraph_capture_batch_sizes" if args.capture_sizes else (
        "three-tier Ascend rule" if vendor == "ascend" else "lmdeploy CUDA runner rule")
    print(f"\nCapture plan: max_batch_size {args.max_batches}, {rule}: {len(sizes)} graphs, captured largest first")
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


DEMO_BACKENDS = ("sim", "cuda")  # where the demo's graphs run: the CPU simulator, or an NVIDIA GPU
AUTOLOAD_ENV = "TORCH_DEVICE_BACKEND_AUTOLOAD"


def demo_needs_child(environ=None) -> bool:
    """Whether the simulator must run in a child process: a real torch_npu is installed and torch would
    load it as a device backend at ``import torch``, taking the PrivateUse1 slot the simulator uses."""
    environ = os.environ if environ is None else environ
    return environ.get(AUTOLOAD_ENV) != "0" and importlib.util.find_spec("torch_npu") is not None


def cmd_demo(args: argparse.Namespace) -> int:
    """The tiny decoder on the CPU graph simulator, eager and graph side by side."""
    import time

    if args.backend == "sim" and demo_needs_child():
        print(f"a real torch_npu is installed: running the simulator in a child process with {AUTOLOAD_ENV}=0",
              flush=True)
        env = dict(os.environ, **{AUTOLOAD_ENV: "0"})
        argv = [sys.executable, "-m", "vendor_graph", *(args.argv or [])]
        return subprocess.call(argv, env=env)

    from . import compat
    from .testing import sim, standins

    standins.use_standin_dlinfer_if_missing()
    from .testing.harness import REAL_TOLERANCE, run

    version = compat.installed_lmdeploy_version()
    vendor = args.vendor
    if compat.series(version) not in compat.SUPPORTED_SERIES[vendor]:
        print(f"vendor_graph.{vendor} does not support lmdeploy {version}; try --vendor ascend")
        return 2
    real = args.backend != "sim"
    if real:
        import torch

        if vendor == "ascend":
            print("--backend cuda runs the Camb and MACA buffer specs on real CUDA graphs: use --vendor camb or "
                  "maca (Ascend graphs need torch_npu)")
            return 2
        if not torch.cuda.is_available():
            print("--backend cuda needs an NVIDIA GPU (torch.cuda.is_available() is False here)")
            return 2
        where = f"lmdeploy's CUDA graph runner on {torch.cuda.get_device_name()}, real CUDA graphs"
        check = f"hidden states and KV within (rtol, atol) = {REAL_TOLERANCE}, greedy tokens equal"
    else:
        sim.install()
        where = ("the CPU graph simulator, simulated torch_npu " + args.generation if vendor == "ascend"
                 else "the CPU graph simulator, lmdeploy's CUDA graph runner")
        check = "hidden states bitwise, greedy tokens, every KV byte"
    print(f"vendor_graph {__version__} demo: vendor {vendor} on {where}, "
          f"lmdeploy {version}, {args.seqs} sequences, {args.steps} decode steps, batch changing every 3 steps")
    start = time.perf_counter()
    pair = run(vendor, args.seed, generation=args.generation, steps=args.steps, num_seqs=args.seqs,
               backend=args.backend)
    seconds = time.perf_counter() - start
    print(f"\nParity with eager over {pair.steps} steps ({check}, no stale padding row): "
          f"{'PASS' if not pair.mismatches else 'FAIL'}")
    for line in pair.mismatches[:5]:
        print(f"  {line}")
    times = {name: sorted(v) for name, v in pair.step_seconds.items() if v}
    if len(times) == 2:
        median = {name: v[len(v) // 2] * 1e3 for name, v in times.items()}
        print(f"Step times {'on the GPU' if real else 'on the simulator'} (median of {len(times['graph'])}; graph "
              f"includes its capture steps): eager {median['eager']:.2f} ms, graph {median['graph']:.2f} ms")
    runner = pair.runner
    print("\nGraph stats (vendor_graph.stats)")
    print(runner.stats.summary())
    if vendor == "ascend":
        paths = sorted({p for g in runner.graphs().values() for p in g.paths})
        print(f"seq-len update path: {', '.join(paths) or '-'}; updates issued: {pair.counters['updates']}")
    else:
        print(f"runner: {type(runner).__name__} (lmdeploy's CUDA graph runner, adopted by vendor_graph)")
    if real:
        print(f"\n{seconds:.1f} s in all, model build and prefill included")
    else:
        print(f"\n{seconds:.1f} s on the simulator: CPU emulation, not a device speed")
    return 0 if not pair.mismatches else 1


def seqlen_ops() -> list[tuple]:
    """(column name, attention op, overload) of the seq-len path table (and of ``doctor``)."""
    from .npu.seqlen import FIA, FIA_V2, MLA, PAGED_ATTENTION, PAGED_ATTENTION_MLA

    return [("FIA `.default`", FIA, ".default"), ("FIA `.out`", FIA, ".out"), ("FIA v2 `.out`", FIA_V2, ".out"),
            ("paged attention", PAGED_ATTENTION, ".default"), ("MLA `.out`", MLA, ".out"),
            ("paged attention MLA", PAGED_ATTENTION_MLA, ".default")]


def seqlen_path_table() -> str:
    """Markdown: every torch_npu release on PyPI -> the seq-len update path per attention op."""
    from .ascend_versions import GENERATION_FACTS, RELEASES
    from .npu.seqlen import path_for

    ops = seqlen_ops()
    lines = ["| torch_npu | generation | " + " | ".join(name for name, _, _ in ops) + " |",
             "|---|---|" + "---|" * len(ops)]
    for release in sorted(RELEASES, key=lambda r: (r.generation, _version_key(r.version))):
        facts = GENERATION_FACTS[release.generation]
        lines.append(f"| {release.version} | {release.generation} | "
                     + " | ".join(path_for(facts, op, overload) for _, op, overload in ops) + " |")
    return "\n".join(lines)


def _version_key(version: str):
    from packaging.version import Version

    return Version(version)


def cmd_paths(args: argparse.Namespace) -> int:
    print(seqlen_path_table())
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from . import doctor

    return doctor.main(args.vendor)


def cmd_run(args: argparse.Namespace) -> int:
    """Replace this process with ``args.cmd``, vendor active in it and every process it starts."""
    from .patching import VENDOR_ENV

    command = list(args.cmd)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("vendor-graph run: nothing to run; usage: vendor-graph run --vendor ascend -- lmdeploy serve "
              "api_server <model> --backend pytorch --device ascend", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env[VENDOR_ENV] = args.vendor
    if env.pop("VENDOR_GRAPH_DISABLE_AUTOLOAD", None) is not None:
        print("vendor-graph run: ignoring VENDOR_GRAPH_DISABLE_AUTOLOAD for this command (it would keep the "
              "vendor off)", file=sys.stderr)
    from .doctor import _autoload_pth

    where = _autoload_pth()
    if "NOT" in where:
        print(f"vendor-graph run: the autoload hook is {where}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)
    except FileNotFoundError:
        print(f"vendor-graph run: {command[0]!r} not found on PATH", file=sys.stderr)
        return 127
    return 0  # pragma: no cover - execvpe does not return


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="vendor-graph", description=__doc__.splitlines()[0])
    parser.add_argument("--log-level", default="WARNING")
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="activate a vendor here and print its capture plan and patch status")
    plan.add_argument("--vendor", choices=VENDORS, default="ascend")
    plan.add_argument("--max-batches", type=int, default=256, help="lmdeploy's max_batch_size")
    plan.add_argument("--capture-sizes", type=int, nargs="+", default=None,
                      help="explicit cudagraph_capture_batch_sizes, as given to lmdeploy")
    sub.add_parser("paths", help="print the torch_npu release -> seq-len update path table (markdown)")
    doctor = sub.add_parser("doctor", help="check this environment: runtimes, versions, patch owners, settings")
    doctor.add_argument("--vendor", choices=VENDORS, default=None,
                        help="also activate this vendor here and show who owns CudaGraphMixin then")
    run = sub.add_parser("run", help="run an lmdeploy command with the vendor active in it and its workers")
    run.add_argument("--vendor", choices=VENDORS, required=True)
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command, e.g. lmdeploy serve api_server ...")
    demo = sub.add_parser("demo", help="the tiny decoder on the CPU graph simulator, eager and graph side by side")
    demo.add_argument("--vendor", choices=VENDORS, default="ascend")
    demo.add_argument("--generation", default="G5", help="simulated torch_npu generation or release (Ascend)")
    demo.add_argument("--steps", type=int, default=64)
    demo.add_argument("--seqs", type=int, default=20)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--backend", choices=DEMO_BACKENDS, default="sim",
                      help="where graphs are captured and replayed (sim: the CPU graph simulator)")
    args = parser.parse_args(argv)
    args.argv = argv
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if args.command == "plan":
        return cmd_plan(args)
    if args.command == "paths":
        return cmd_paths(args)
    if args.command == "demo":
        return cmd_demo(args)
    if args.command == "doctor":
        return cmd_doctor(args)
    if args.command == "run":
        return cmd_run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
