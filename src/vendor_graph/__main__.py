"""``vendor-graph`` / ``python -m vendor_graph``: command-line entry points.

``demo`` (the README's main job): the tiny decoder on the CPU graph simulator, eager and graph side by
side, with the parity verdict and the runner's stats.

``paths``: the torch_npu release -> seq-len update path table.

``plan``: activate a vendor in the real lmdeploy installed here and print what graph mode will do:
patch status (whose methods own lmdeploy's CudaGraphMixin now), the capture sizes and the padding
they cost, the buffers the vendor binds on this lmdeploy release, and a self-check of those buffers
run through lmdeploy's mixin.
"""

from __future__ import annotations

import argparse
import importlib
import logging
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


def cmd_demo(args: argparse.Namespace) -> int:
    """The tiny decoder on the CPU graph simulator, eager and graph side by side."""
    import time

    from . import compat
    from .testing import sim, standins

    standins.use_standin_dlinfer_if_missing()
    from .testing.harness import run

    version = compat.installed_lmdeploy_version()
    vendor = args.vendor
    if compat.series(version) not in compat.SUPPORTED_SERIES[vendor]:
        print(f"vendor_graph.{vendor} does not support lmdeploy {version}; try --vendor ascend")
        return 2
    sim.install()
    where = f"simulated torch_npu {args.generation}" if vendor == "ascend" else "lmdeploy's CUDA graph runner"
    print(f"vendor_graph {__version__} demo: vendor {vendor} on the CPU graph simulator ({where}), "
          f"lmdeploy {version}, {args.seqs} sequences, {args.steps} decode steps, batch changing every 3 steps")
    start = time.perf_counter()
    pair = run(vendor, args.seed, generation=args.generation, steps=args.steps, num_seqs=args.seqs)
    seconds = time.perf_counter() - start
    print(f"\nParity with eager over {pair.steps} steps (hidden states bitwise, greedy tokens, every KV byte, "
          f"no stale padding row): {'PASS' if not pair.mismatches else 'FAIL'}")
    for line in pair.mismatches[:5]:
        print(f"  {line}")
    runner = pair.runner
    if hasattr(runner, "stats"):
        print("\nGraph stats (vendor_graph.stats)")
        print(runner.stats.summary())
        paths = sorted({p for g in runner.graphs().values() for p in g.paths})
        print(f"seq-len update path: {', '.join(paths) or '-'}; updates issued: {pair.counters['updates']}")
    else:
        single = compat.cuda_runner_graphs(runner)
        print(f"\ngraphs captured by lmdeploy's CUDA runner: batches {sorted(k[0] for k in single)}")
    print(f"\n{seconds:.1f} s on the simulator: CPU emulation, not a device speed")
    return 0 if not pair.mismatches else 1


def seqlen_path_table() -> str:
    """Markdown: every torch_npu release on PyPI -> the seq-len update path per attention op."""
    from .ascend_versions import GENERATION_FACTS, RELEASES
    from .npu.seqlen import FIA, FIA_V2, MLA, PAGED_ATTENTION, PAGED_ATTENTION_MLA, path_for

    ops = [("FIA `.default`", FIA, ".default"), ("FIA `.out`", FIA, ".out"), ("FIA v2 `.out`", FIA_V2, ".out"),
           ("paged attention", PAGED_ATTENTION, ".default"), ("MLA `.out`", MLA, ".out"),
           ("paged attention MLA", PAGED_ATTENTION_MLA, ".default")]
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vendor-graph", description=__doc__.splitlines()[0])
    parser.add_argument("--log-level", default="WARNING")
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="activate a vendor here and print its capture plan and patch status")
    plan.add_argument("--vendor", choices=VENDORS, default="ascend")
    plan.add_argument("--max-batches", type=int, default=256, help="lmdeploy's max_batch_size")
    plan.add_argument("--capture-sizes", type=int, nargs="+", default=None,
                      help="explicit cudagraph_capture_batch_sizes, as given to lmdeploy")
    sub.add_parser("paths", help="print the torch_npu release -> seq-len update path table (markdown)")
    demo = sub.add_parser("demo", help="the tiny decoder on the CPU graph simulator, eager and graph side by side")
    demo.add_argument("--vendor", choices=VENDORS, default="ascend")
    demo.add_argument("--generation", default="G5", help="simulated torch_npu generation or release (Ascend)")
    demo.add_argument("--steps", type=int, default=64)
    demo.add_argument("--seqs", type=int, default=20)
    demo.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if args.command == "plan":
        return cmd_plan(args)
    if args.command == "paths":
        return cmd_paths(args)
    if args.command == "demo":
        return cmd_demo(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
