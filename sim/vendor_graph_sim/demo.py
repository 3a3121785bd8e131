"""``vendor-graph demo``, which this package adds to the runtime's CLI (entry point ``vendor_graph.commands``).

The tiny decoder on the CPU graph simulator, eager and graph side by side, with the parity verdict and
the runner's stats; ``--json PATH`` also writes the verdict and the runner's counts there. Where a real
torch_npu is installed, the simulator runs in a child process with torch's device-backend autoload off.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from vendor_graph import VENDORS, __version__
from vendor_graph.buckets import MAX_BATCHES_LIMIT
from vendor_graph.cli import (
    MAX_BATCHES_WHY,
    UsageError,
    count_type,
    generation_type,
    json_path_type,
)

DEMO_MODEL = "tiny"  # the decoder the demo builds by default (vendor_graph_sim.tiny_model)
# lmdeploy's own models over the real dlinfer (vendor_graph_sim.realstack)
REAL_STACK_MODELS = ("lmdeploy-llama", "lmdeploy-mla")


DEMO_BACKENDS = ("sim", "cuda")  # where the demo's graphs run: the CPU simulator, or an NVIDIA GPU
AUTOLOAD_ENV = "TORCH_DEVICE_BACKEND_AUTOLOAD"


def demo_needs_child(environ=None) -> bool:
    """Whether the simulator must run in a child process: a real torch_npu is installed and torch would
    load it as a device backend at ``import torch``, taking the PrivateUse1 slot the simulator uses."""
    environ = os.environ if environ is None else environ
    return environ.get(AUTOLOAD_ENV) != "0" and importlib.util.find_spec("torch_npu") is not None


def _dlinfer_in_use() -> str | None:
    """The version of the dlinfer lmdeploy imports here; None for none or the stand-in."""
    from . import standins

    spec = importlib.util.find_spec("dlinfer")
    if spec is None or spec.origin is None or standins.is_standin(spec.origin):
        return None
    for dist in ("dlinfer-ascend", "dlinfer-camb", "dlinfer-maca", "dlinfer"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(dist)
    return "unversioned"


def write_json(path: Path, record: dict[str, Any]) -> None:
    """Write ``record`` to ``path`` atomically: a reader sees the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8") as f:
            json.dump(record, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise UsageError(f"cannot write --json {path}: {exc.strerror or exc}; give a writable path") from None


def cmd_demo(args: argparse.Namespace) -> int:
    """The tiny decoder on the CPU graph simulator, eager and graph side by side."""
    import time

    if args.backend == "sim" and demo_needs_child():
        print(f"a real torch_npu is installed: running the simulator in a child process with {AUTOLOAD_ENV}=0",
              flush=True)
        env = dict(os.environ, **{AUTOLOAD_ENV: "0"})
        argv = [sys.executable, "-m", "vendor_graph", *(args.argv or [])]
        return subprocess.call(argv, env=env)

    if args.model != DEMO_MODEL:
        return _real_stack_demo(args)

    from vendor_graph import compat

    from . import device as sim
    from . import standins

    try:
        standins.use_standin_dlinfer_if_missing()
    except RuntimeError as exc:  # no dlinfer and no stand-in beside this copy of vendor_graph
        raise UsageError(str(exc)) from None
    from .harness import REAL_TOLERANCE, run

    version = compat.installed_lmdeploy_version()
    vendor = args.vendor
    if compat.series(version) not in compat.SUPPORTED_SERIES[vendor]:
        supporting = compat.vendors_supporting(version)
        raise UsageError(f"vendor_graph.{vendor} does not support lmdeploy {version}; "
                         + (f"try --vendor {' or '.join(supporting)}" if supporting else
                            "install a supported lmdeploy (vendor-graph doctor lists them)"))
    real = args.backend != "sim"
    generation = torch_npu = None
    if real:
        import torch

        if vendor == "ascend":
            raise UsageError("--backend cuda runs the Camb and MACA buffer specs on real CUDA graphs: use --vendor "
                             "camb or maca (Ascend graphs need torch_npu)")
        if not torch.cuda.is_available():
            raise UsageError("--backend cuda needs an NVIDIA GPU (torch.cuda.is_available() is False here); "
                             "leave --backend out to run on the CPU simulator")
        where = f"lmdeploy's CUDA graph runner on {torch.cuda.get_device_name()}, real CUDA graphs"
        check = f"hidden states and KV within (rtol, atol) = {REAL_TOLERANCE}, greedy tokens equal"
    else:
        sim.install()
        if vendor == "ascend":
            torch_npu, generation = sim.resolve(args.generation)
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
    seqlen_path = None
    if vendor == "ascend":
        paths = sorted({p for g in runner.graphs().values() for p in g.paths})
        seqlen_path = ", ".join(paths) or None
        print(f"seq-len update path: {seqlen_path or '-'}; updates issued: {pair.counters['updates']}")
    else:
        print(f"runner: {type(runner).__name__} (lmdeploy's CUDA graph runner, adopted by vendor_graph)")
    if real:
        print(f"\n{seconds:.1f} s in all, model build and prefill included")
    else:
        print(f"\n{seconds:.1f} s on the simulator: CPU emulation, not a device speed")
    if args.json is not None:
        write_json(args.json, {
            "parity": not pair.mismatches, "steps": pair.steps, "graph_replays": runner.stats.replays,
            "eager_steps": sum(runner.stats.eager_steps.values()), "captures": runner.stats.captures,
            "vendor": vendor, "backend": args.backend, "lmdeploy": str(version), "generation": generation,
            "torch_npu": torch_npu, "seqlen_path": seqlen_path, "model": DEMO_MODEL,
            "dlinfer": _dlinfer_in_use(), "seqs": args.seqs, "seed": args.seed,
            "vendor_graph": __version__,
        })
    return 0 if not pair.mismatches else 1


def _real_stack_demo(args: argparse.Namespace) -> int:
    """lmdeploy's own model and Ascend backend over the real dlinfer, eager and graph side by side."""
    import time

    from vendor_graph import compat, settings

    from . import realstack

    if args.vendor != "ascend" or args.backend != "sim":
        raise UsageError(f"--model {args.model} runs lmdeploy's Ascend backend on the simulated NPU: use "
                         f"--vendor ascend --backend sim (or leave both out)")
    try:
        realstack.dlinfer_origin()
    except realstack.DlinferUnavailable as exc:
        raise UsageError(str(exc)) from None
    except settings.SettingsError as exc:
        raise UsageError(str(exc)) from None
    from . import device as sim

    version = compat.installed_lmdeploy_version()
    torch_npu, generation = sim.resolve(realstack.pinned_release(args.generation))
    print(f"vendor_graph {__version__} demo: {args.model} built by lmdeploy {version} (AscendOpsBackend, real "
          f"dlinfer) on the CPU graph simulator, simulated torch_npu {torch_npu} ({generation}); "
          f"{args.steps} decode steps, up to {min(args.seqs, realstack.MAX_SEQS)} sequences joining and finishing")
    start = time.perf_counter()
    record = realstack.run(args.model, torch_npu, steps=args.steps, max_seqs=min(args.seqs, realstack.MAX_SEQS),
                           seed=args.seed)
    dlinfer = realstack.dlinfer_description()
    print(f"\nParity with lmdeploy eager_mode=True over {record.steps} decode steps (greedy tokens, hidden states "
          f"bitwise, every KV byte outside the live tokens): {'PASS' if record.parity else 'FAIL'}")
    for line in record.mismatches[:5]:
        print(f"  {line}")
    print(f"graph replays {record.graph_replays}, captures {record.captures}, eager steps {record.eager_steps}"
          + "".join(f"\n  eager: {n} x {reason}" for reason, n in record.eager_reasons.items()))
    print(f"seq-len update path: {', '.join(record.seqlen_paths) or '-'}; prefill: {record.prefill}")
    print(f"{dlinfer}; {time.perf_counter() - start:.1f} s on the simulator: CPU emulation, not a device speed")
    if args.json is not None:
        write_json(args.json, {
            "parity": record.parity, "steps": record.steps, "graph_replays": record.graph_replays,
            "eager_steps": record.eager_steps, "eager_reasons": record.eager_reasons, "captures": record.captures,
            "seqlen_path": ", ".join(record.seqlen_paths) or None, "vendor": "ascend", "backend": "sim",
            "generation": generation, "torch_npu": torch_npu, "model": args.model, "dlinfer": dlinfer,
            "lmdeploy": str(version), "prefill": record.prefill, "mismatches": record.mismatches[:20],
            "seed": args.seed, "vendor_graph": __version__,
        })
    return 0 if record.parity else 1


def add_command(sub: argparse._SubParsersAction) -> None:
    """The ``vendor_graph.commands`` entry point: adds ``demo`` to ``vendor-graph``."""
    demo = sub.add_parser("demo", help="the tiny decoder on the CPU graph simulator, eager and graph side by side")
    demo.add_argument("--vendor", choices=VENDORS, default="ascend")
    demo.add_argument("--model", choices=(DEMO_MODEL, *REAL_STACK_MODELS), default=DEMO_MODEL,
                      help="tiny: the simulator's own decoder; lmdeploy-llama / lmdeploy-mla: lmdeploy's model "
                           "classes and Ascend backend over the real dlinfer (VENDOR_GRAPH_DLINFER_SRC or installed)")
    demo.add_argument("--generation", default="G5", type=generation_type,
                      help="simulated torch_npu (Ascend): a generation G0 ... G5 or a torch_npu release")
    demo.add_argument("--steps", default=64, type=count_type(
        "--steps", "a PASS over no decode step would prove nothing", 64))
    demo.add_argument("--seqs", default=20, type=count_type(
        "--seqs", "the demo decodes at least 1 sequence", 20, high=MAX_BATCHES_LIMIT,
        why_high=f"the demo's max_batch_size is --seqs, and {MAX_BATCHES_WHY}"))
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--backend", choices=DEMO_BACKENDS, default="sim",
                      help="where graphs are captured and replayed (sim: the CPU graph simulator)")
    demo.add_argument("--json", type=json_path_type, default=None, metavar="PATH",
                      help="also write the verdict and counts there as JSON")
    demo.set_defaults(handler=cmd_demo)
