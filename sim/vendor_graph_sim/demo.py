"""``vendor-graph demo``, which this package adds to the runtime's CLI (entry point ``vendor_graph.commands``).

By default, lmdeploy's own ``pipeline()`` on the vendor's simulated device (:mod:`vendor_graph_sim.engine`; the
Ascend NPU, ``--vendor camb``'s MLU, ``--vendor maca``'s device): a tiny random-weight checkpoint served eager
(``eager_mode=True``) and in graph mode with ``vendor_graph.<vendor>`` active, over the real dlinfer, on a workload
whose requests queue, join mid-run and finish at different lengths; it prints whether every request's greedy
tokens are equal, the runner lmdeploy built, its stats and the bridges applied. ``--model tiny`` runs the
simulator's tiny decoder instead, eager and graph side by side, step by step.
``--json PATH`` also writes the verdict and the runner's counts there. ``--serve`` serves the workload through
lmdeploy's OpenAI server instead (:mod:`vendor_graph_sim.serve`): ``lmdeploy serve api_server`` under
``vendor-graph run --vendor <vendor>`` on the simulated device, on a loopback port, sent concurrent requests by the
``openai`` client, stopped with SIGTERM, and the same with ``--eager-mode``.

Exit status: 0 when graph mode matched eager (and, for the engine, vendor_graph's runner replayed graphs), 1
when it did not, 2 for a command line or environment that cannot run (one line naming the fix). Where a real
torch_npu is installed, the tiny decoder runs in a child process with torch's device-backend autoload off.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import importlib.machinery
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from vendor_graph import VENDORS, __version__
from vendor_graph.ops.cli import UsageError, count_type, generation_type, json_path_type

from . import engine

DEMO_MODEL = "tiny"  # the simulator's own decoder (vendor_graph_sim.tiny_model)
ENGINE_MODELS = engine.MODELS  # served by lmdeploy's pipeline() over the real dlinfer
ENGINE_MODEL = ENGINE_MODELS[0]
TINY_OPTIONS = {"steps": 64, "seqs": 20, "backend": "sim"}  # the tiny decoder's options and their defaults
# The tiny decoder's bounds (tests/unit/test_demo_bounds.py checks them against the model and the schedule): one
# sequence holds TINY_TOKENS tokens (tiny_model.TinyConfig.max_seq_len), a prompt takes up to TINY_PROMPT
# (harness.prompts), and a sequence may stay in the batch for every step, so MAX_STEPS steps always fit.
TINY_TOKENS = 128
TINY_PROMPT = 30
MAX_STEPS = TINY_TOKENS - TINY_PROMPT
MAX_STEPS_WHY = (f"a sequence of the tiny decoder holds {TINY_TOKENS} tokens, a prompt takes up to {TINY_PROMPT}, and "
                 f"a sequence may decode at every step")
MAX_SEQS = 256  # lmdeploy's default max_batch_size on Ascend, Camb and MACA
MAX_SEQS_WHY = (f"{MAX_SEQS} is lmdeploy's default max_batch_size on Ascend, Camb and MACA, and the CPU emulation runs "
                f"every step twice (eager and graph)")
REQUESTS = 8
MAX_REQUESTS = 32
MAX_BATCH_SIZE = 4  # below REQUESTS: requests queue and join as others finish
SAMPLE_WORDS = 8
# what the engine demo runs on per vendor: the simulated device's words, and the real runtime it never runs beside
SIMULATED_DEVICE = {"ascend": "the simulated Ascend NPU", "camb": "the simulated Cambricon MLU",
                    "maca": "the simulated MetaX MACA device"}
REAL_RUNTIME = {"ascend": "torch_npu", "camb": "torch_mlu", "maca": "mcoplib"}


DEMO_BACKENDS = ("sim", "cuda")  # where the tiny decoder's graphs run: the CPU simulator, or an NVIDIA GPU
AUTOLOAD_ENV = "TORCH_DEVICE_BACKEND_AUTOLOAD"
NO_DLINFER = ("the engine demo runs lmdeploy's dlinfer backend over the real dlinfer, and there is none here: set "
              "VENDOR_GRAPH_DLINFER_SRC to a dlinfer source checkout (the folder holding dlinfer/__init__.py; "
              "scripts/demo.sh uses the snapshot beside the clone) or install dlinfer; "
              "vendor-graph demo --model tiny runs without it")


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


def _model(args: argparse.Namespace) -> str:
    """The model to run: ``--model``, else lmdeploy's engine; refuses the options of the one the command line does
    not run."""
    model = args.model or ENGINE_MODEL
    if model == DEMO_MODEL:
        if args.requests is not None:
            raise UsageError("--requests sets the engine demo's workload; the tiny decoder's demo (--model tiny) "
                             "takes --steps and --seqs")
        for name, default in TINY_OPTIONS.items():
            if getattr(args, name) is None:
                setattr(args, name, default)
        return model
    given = [f"--{name}" for name in TINY_OPTIONS if getattr(args, name) is not None]
    if given:
        flags = given[0] if len(given) == 1 else f"{', '.join(given[:-1])} and {given[-1]}"
        raise UsageError(f"{flags} {'is an option' if len(given) == 1 else 'are options'} of the tiny decoder's demo: "
                         f"add --model tiny (the engine demo, --model {model}, serves requests through lmdeploy's "
                         f"pipeline; --requests sets how many)")
    args.requests = REQUESTS if args.requests is None else args.requests
    return model


def cmd_demo(args: argparse.Namespace) -> int:
    if args.serve and args.model == DEMO_MODEL:
        raise UsageError(f"--serve runs lmdeploy's OpenAI server on {SIMULATED_DEVICE[args.vendor]}: use --model "
                         f"lmdeploy-llama or lmdeploy-mla (the tiny decoder has no server)")
    model = _model(args)
    if args.serve:
        return _serve_demo(args, model)
    if model != DEMO_MODEL:
        return _engine_demo(args, model)
    if args.backend == "sim" and demo_needs_child():
        print(f"a real torch_npu is installed: running the simulator in a child process with {AUTOLOAD_ENV}=0",
              flush=True)
        env = dict(os.environ, **{AUTOLOAD_ENV: "0"})
        argv = [sys.executable, "-m", "vendor_graph", *(args.argv or [])]
        return subprocess.call(argv, env=env)
    return _tiny_demo(args)


def _tiny_demo(args: argparse.Namespace) -> int:
    """The tiny decoder on the CPU graph simulator, eager and graph side by side."""
    from vendor_graph.upstream import compat

    from . import device as sim
    from . import standins

    try:
        standins.use_standin_dlinfer_if_missing()
    except RuntimeError as exc:  # no dlinfer and no stand-in beside this copy of vendor_graph
        raise UsageError(str(exc)) from None
    from .harness import REAL_TOLERANCE, run

    version = compat.installed_lmdeploy_version()
    vendor = args.vendor
    _check_lmdeploy(vendor, version)
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
               backend=args.backend, num_blocks=tiny_blocks(args.seqs, args.steps))
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
    print("\nGraph stats (vendor_graph.runtime.counters)")
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
            "vendor_graph": __version__, "engine": False,
        })
    return 0 if not pair.mismatches else 1


def tiny_blocks(seqs: int, steps: int) -> int:
    """KV blocks per cache for the tiny demo: the model's default, or enough for every sequence at its longest
    (block 0 is reserved for padding)."""
    from .tiny_model import TinyConfig

    config = TinyConfig()
    per_sequence = -(-(TINY_PROMPT + steps) // config.block_size)
    return max(config.num_blocks, seqs * per_sequence + 1)


def _check_lmdeploy(vendor: str, version: Any) -> None:
    from vendor_graph.upstream import compat

    if compat.series(version) not in compat.SUPPORTED_SERIES[vendor]:
        supporting = compat.vendors_supporting(version)
        raise UsageError(f"vendor_graph.{vendor} does not support lmdeploy {version}; "
                         + (f"try --vendor {' or '.join(supporting)}" if supporting else
                            "install a supported lmdeploy (vendor-graph doctor lists them)"))


# -- lmdeploy's engine on the simulated NPU ---------------------------------------------------------------------


def _simulated_torch_npu(spec: str) -> tuple[str, str]:
    """(release, generation) the simulated torch_npu runs as for ``--generation spec``; a generation without the
    graph API, or without a release dlinfer admits, is refused naming what runs."""
    from vendor_graph.vendors.ascend.releases import GENERATION_FACTS, release_of

    from . import boot

    try:
        release = boot.pinned_release(spec)
    except boot.SimSwitchError as exc:
        raise UsageError(str(exc)) from None
    generation = release_of(release).generation
    if not GENERATION_FACTS[generation]["graph_api"]:
        raise UsageError(f"torch_npu {release} ({generation}) has no NPUGraph API, and dlinfer's Ascend graph module "
                         f"does not import without it, so lmdeploy's Ascend backend cannot start: give --generation "
                         f"G1 or later (--model tiny runs {generation})")
    return release, generation


@dataclasses.dataclass(frozen=True)
class _Device:
    """The simulated device a demo runs lmdeploy on."""

    vendor: str
    switch: str  # the simulator switch's value: a torch_npu release, or the vendor (camb, maca)
    generation: str | None  # Ascend's torch_npu generation
    release: str | None  # Ascend's torch_npu release

    @property
    def words(self) -> str:
        if self.vendor == "ascend":
            return f"{SIMULATED_DEVICE[self.vendor]}, torch_npu {self.release} ({self.generation})"
        return SIMULATED_DEVICE[self.vendor]


def _device(args: argparse.Namespace, what: str, instead: str) -> _Device:
    """The simulated device of ``args.vendor``; refused where that vendor's real runtime is installed (the simulator
    never runs beside it), naming what to run ``instead``."""
    runtime = REAL_RUNTIME[args.vendor]
    real = importlib.machinery.PathFinder.find_spec(runtime)
    if real is not None:
        raise UsageError(f"a real {runtime} is installed ({real.origin}): the {what} serves lmdeploy on "
                         f"{SIMULATED_DEVICE[args.vendor]}, which never runs beside a real one; on this machine run "
                         f"{instead}")
    if args.vendor != "ascend":
        return _Device(args.vendor, args.vendor, None, None)
    release, generation = _simulated_torch_npu(args.generation)
    return _Device("ascend", release, generation, release)


def _switch_on(device: _Device) -> None:
    """The simulator switch on in this process for ``device``; already on (``VENDOR_GRAPH_SIM`` at start), it must
    name the same device (the same torch_npu)."""
    from . import boot

    finder = boot.active()
    if finder is None or finder.spec is None:
        try:
            engine.switch_on(device.switch)
        except RuntimeError as exc:  # the vendor's runtime or dlinfer imported before the switch
            raise UsageError(f"{exc}; the demo needs a fresh process") from None
        return
    try:
        if finder.vendor != device.vendor:
            same = False
        else:
            same = device.vendor != "ascend" or boot.pinned_release(finder.spec) == device.release
    except boot.SimSwitchError as exc:
        raise UsageError(str(exc)) from None
    if not same:
        fix = f"--generation {finder.spec}" if finder.vendor == "ascend" else f"--vendor {finder.vendor}"
        raise UsageError(f"{boot.ENV}={finder.spec} already chose this process's simulated device, not "
                         f"{device.switch}: give {fix}, or unset {boot.ENV}")


def _dlinfer_source() -> str:
    """Where the engine's dlinfer comes from: ``VENDOR_GRAPH_DLINFER_SRC`` or an installed dlinfer (never the
    test stand-in); :class:`UsageError` naming how to provide one when there is none."""
    from . import standins
    from .variables import dlinfer_src

    root = dlinfer_src()
    if root is not None:
        return f"source checkout {root}"
    spec = importlib.util.find_spec("dlinfer")
    if spec is None or spec.origin is None or standins.is_standin(spec.origin):
        raise UsageError(NO_DLINFER)
    return f"installed {_dlinfer_in_use()} ({Path(spec.origin).parent})"


class _WithoutProgressBars:
    """A text stream that passes everything on to ``stream`` except tqdm's progress bars, which lmdeploy draws
    while it loads the weights and warms up: each drawing is ``\\r<description>: NN%|...| n/total [...]``, and
    a bar ends with a newline."""

    BAR = re.compile(r"\r[^\r\n]*\d+%\|[^\r\n]*\| *\d+/\d+ \[[^\r\n]*")

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._in_bar = False

    def write(self, text: str) -> int:
        if self.BAR.fullmatch(text) or (self._in_bar and text == ""):
            self._in_bar = True
            return len(text)
        if self._in_bar and text == "\n":
            self._in_bar = False
            return len(text)
        self._in_bar = False
        return self._stream.write(text)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _DisplacedReported(logging.Filter):
    """vendor_graph's warnings that another package replaced its methods and that it put them back: the demo
    reports them in one line (from ``patching.active().displaced``) instead of one warning each."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.WARNING and str(record.msg).endswith("vendor_graph's is back in force"))


@contextlib.contextmanager
def _quiet(log_level: str) -> Iterator[None]:
    """lmdeploy's INFO log and progress bars off (its errors stay on), vendor_graph's displacement warnings
    summarised; ``--log-level DEBUG`` or ``INFO`` keeps lmdeploy's log at that level."""
    from lmdeploy.utils import get_logger

    get_logger("lmdeploy").setLevel(log_level if log_level in ("DEBUG", "INFO") else logging.ERROR)
    quiet = _DisplacedReported()
    vendor_graph_log = logging.getLogger("vendor_graph")
    vendor_graph_log.addFilter(quiet)
    try:
        with contextlib.redirect_stderr(_WithoutProgressBars(sys.stderr)):
            yield
    finally:
        vendor_graph_log.removeFilter(quiet)


def _requests(responses: list[Any]) -> str:
    return "1 request" if len(responses) == 1 else f"{len(responses)} requests"


def _workload(load: list[engine.Request]) -> str:
    lengths = sorted(r.max_new_tokens for r in load)
    if len(load) == 1:
        return f"1 request, max_batch_size {MAX_BATCH_SIZE}: it stops after {lengths[0]} new tokens"
    how = "requests queue, join as others finish and" if len(load) > MAX_BATCH_SIZE else "requests"
    return (f"{len(load)} requests, max_batch_size {MAX_BATCH_SIZE}: {how} stop after {lengths[0]} to {lengths[-1]} "
            f"new tokens")


def _words(text: str, limit: int = SAMPLE_WORDS) -> str:
    words = text.split()
    return " ".join(words) if len(words) <= limit else f"{' '.join(words[:limit])} ... ({len(words)} words)"


def _seqlen_updates(before: dict[str, int], after: dict[str, int]) -> tuple[str | None, str]:
    """The seq-len update path the simulator saw the graph run take, and what it issued: ``NPUGraph.update``
    calls (graph-update; each re-issues the captured attention tasks), else captured-task updates of their own
    (task-update)."""
    calls, tasks = (after.get(op, 0) - before.get(op, 0) for op in ("NPUGraph.update", "graph.task_update"))
    if calls:
        return "graph-update", f"{calls} NPUGraph.update calls, re-issuing {tasks} captured attention tasks"
    if tasks:
        return "task-update", f"{tasks} captured-task updates (graph_task_update_begin/end)"
    return None, "no update issued"


@dataclasses.dataclass
class _Served:
    """The workload served in graph mode and eagerly, and what the graph-mode run's runner recorded."""

    graph: engine.EngineRun
    eager: engine.EngineRun
    summary: str | None  # the runner's stats table (vendor_graph.runtime.counters), None without a vendor_graph runner
    sizes: list[int]  # its capture sizes
    seqlen_path: str | None
    updates: str  # what the simulator counted of the seq-len updates

    @property
    def comparison(self) -> engine.Comparison:
        return engine.Comparison(self.eager, self.graph)

    @property
    def problems(self) -> list[str]:
        ours = self.graph.runner.startswith("vendor_graph.")
        return [text for failed, text in (
            (not self.comparison.tokens_equal, "graph mode's tokens are not eager's"),
            (not ours, "lmdeploy did not build vendor_graph's runner"),
            (ours and not self.graph.replays, "vendor_graph's runner replayed no graph"),
        ) if failed]


def _engine_demo(args: argparse.Namespace, model: str) -> int:
    """lmdeploy's pipeline on the vendor's simulated device, graph mode (vendor_graph.<vendor>) against
    eager_mode=True."""
    start = time.perf_counter()
    device = _device(args, "engine demo", f"lmdeploy itself after import vendor_graph.{args.vendor}, or "
                     f"vendor-graph demo --model tiny")
    source = _dlinfer_source()
    from vendor_graph.upstream import compat

    version = compat.installed_lmdeploy_version()
    _check_lmdeploy(device.vendor, version)
    _switch_on(device)
    importlib.import_module(f"vendor_graph.{device.vendor}")  # what a user writes before lmdeploy starts

    print(f"vendor_graph {__version__} demo: lmdeploy {version}'s pipeline(device_type={device.vendor!r}) on "
          f"{device.words}, dlinfer {source}", flush=True)
    load = engine.workload(args.seed, requests=args.requests)
    print(f"{model} (random weights, word-level tokenizer), {_workload(load)} (greedy)\n", flush=True)
    served = _serve(model, load, args)
    dlinfer = f"dlinfer {getattr(sys.modules.get('dlinfer'), '__version__', '?')}"
    _report(served, load, dlinfer)
    seconds = time.perf_counter() - start
    print(f"\n{seconds:.1f} s in all (two engines built, warmed up and served): the simulator is CPU emulation, "
          f"not a device speed")
    if args.json is not None:
        from vendor_graph.install import bridges

        graph, comparison = served.graph, served.comparison
        write_json(args.json, {
            "parity": comparison.tokens_equal, "steps": sum(graph.histogram.values()),
            "graph_replays": graph.replays, "eager_steps": sum(graph.eager_reasons.values()),
            "eager_reasons": graph.eager_reasons, "captures": graph.captures, "vendor": device.vendor,
            "backend": "sim", "lmdeploy": str(version), "generation": device.generation, "torch_npu": device.release,
            "seqlen_path": served.seqlen_path, "model": model, "dlinfer": f"{dlinfer} ({source})", "seqs": len(load),
            "seed": args.seed, "vendor_graph": __version__, "engine": True, "executor": graph.executor,
            "requests": len(load), "max_batch_size": MAX_BATCH_SIZE, "tokens_equal": comparison.tokens_equal,
            "first_difference": comparison.first_difference(), "tokens": graph.token_count, "runner": graph.runner,
            "batch_histogram": graph.histogram, "capture_sizes": served.sizes,
            "bridges": sorted({b.name for b in bridges.applied()}), "seconds": round(seconds, 1),
        })
    return 1 if served.problems else 0


def _serve(model: str, load: list[engine.Request], args: argparse.Namespace) -> _Served:
    """``load`` through lmdeploy's pipeline in graph mode, then with ``eager_mode=True``, on one checkpoint."""
    from vendor_graph.runtime import counters

    from . import device as sim

    with _quiet(args.log_level), tempfile.TemporaryDirectory(prefix="vendor-graph-demo-") as tmp:
        checkpoint = engine.write_model(model, Path(tmp) / model, args.seed)
        kwargs = dict(model=model, requests=load, max_batch_size=MAX_BATCH_SIZE)
        by_op = dict(sim.counters.by_op)
        graph = engine.run(checkpoint, graph=True, **kwargs)
        seqlen_path, updates = _seqlen_updates(by_op, dict(sim.counters.by_op))
        # The only runner so far: the eager run's, built next with the same capture plan, would merge into it.
        record = max(counters.runs(), key=lambda r: r.stats.decode_steps, default=None)
        print(f"graph mode (vendor_graph.{graph.vendor}): {_requests(graph.tokens)}, {graph.token_count} tokens in "
              f"{graph.seconds:.1f} s", flush=True)
        eager = engine.run(checkpoint, graph=False, **kwargs)
        print(f"eager mode (eager_mode=True): {_requests(eager.tokens)}, {eager.token_count} tokens in "
              f"{eager.seconds:.1f} s", flush=True)
    return _Served(graph, eager, record.stats.summary() if record is not None else None,
                   record.capture_sizes() if record is not None else [], seqlen_path, updates)


def _report(served: _Served, load: list[engine.Request], dlinfer: str) -> None:
    """The verdict, the runner and its stats, what vendor_graph changed in the stack, one request's text."""
    from vendor_graph.install import bridges, patching

    from .boot import STANDIN_LABEL

    graph, eager, comparison = served.graph, served.eager, served.comparison
    print(f"\nGreedy tokens of every request equal, graph mode vs eager: "
          f"{'yes' if comparison.tokens_equal else 'NO'} ({_requests(eager.tokens)}, {eager.token_count} tokens "
          f"eager, {graph.token_count} graph)")
    difference = comparison.first_difference()
    if difference:
        print(f"  first difference: {difference}")
    ours = graph.runner.startswith("vendor_graph.")
    print(f"Runner lmdeploy built: {graph.runner or '-'} ({'vendor_graph' if ours else 'NOT vendor_graph'}'s), "
          f"over {dlinfer}")
    if served.problems:
        print(f"FAIL: {'; '.join(served.problems)}")

    print(f"\nGraph stats of the graph-mode run (vendor_graph.runtime.counters): {graph.captures} captures, "
          f"{graph.replays} replays")
    print(served.summary or "(no vendor_graph runner ran)")
    batches = sorted((int(b), n) for b, n in graph.histogram.items())
    padded = [f"batch {b} pads to {min(s for s in served.sizes if s >= b)}" for b, _ in batches
              if b not in served.sizes and any(s >= b for s in served.sizes)]
    print(f"decode steps per batch size: {', '.join(f'{b}: {n}' for b, n in batches) or '-'} (graphs of "
          f"{', '.join(map(str, served.sizes)) or '-'}{''.join('; ' + p for p in padded)})")
    if graph.vendor == "ascend":
        print(f"seq-len update path: {served.seqlen_path or '-'}: {served.updates}, as the simulator counted them")
    else:
        print(f"seq-len update: none needed ({graph.vendor}'s decode kernel reads the KV lengths from the graph's "
              f"device buffers; max_kv_seq_len is -1 in them)")

    applied = {b.name: b for b in bridges.applied()}
    print(f"\nBridges applied (vendor_graph.install.bridges): {len(applied) or 'none'}")
    for bridge in applied.values():
        print(f"  {bridge.name}: {bridge.description}")
    activation = patching.active()
    displaced = sorted({(target.rsplit(".", 1)[-1], who.rsplit(".", 1)[0])
                        for target, who in (activation.displaced if activation is not None else [])})
    if displaced:
        print(f"{', '.join(sorted({who for _, who in displaced}))} replaced {len(displaced)} of vendor_graph's "
              f"CudaGraphMixin methods when lmdeploy imported it; vendor_graph put its own back")
    standins = sorted(name for name, module in list(sys.modules.items())
                      if STANDIN_LABEL in getattr(module, "__dict__", {}))
    if standins:
        print(f"labelled stand-ins for what no CPU build provides: {', '.join(standins)}")

    if load and graph.texts:
        print(f"\nRequest 0: {_words(load[0].prompt)}\n  -> {_words(graph.texts[0])}")


# -- lmdeploy's OpenAI server on the simulated NPU (--serve) -------------------------------------------------------

SERVER_NEEDS = ("openai", "fastapi", "uvicorn", "partial_json_parser")  # requirements/lmdeploy-imports.txt has them


def _served(run: Any) -> str:
    """One server's life in a line: ready, the workload, SIGTERM."""
    down = run.shutdown
    stop = ("no answer to SIGTERM" if down is None else
            f"SIGTERM: every process gone in {down.seconds:.1f} s" if not down.forced and not down.strays else
            f"SIGTERM: {len(down.strays)} processes left after {down.seconds:.0f} s, killed")
    failed = len(run.answers) - len(run.ok)
    return (f"ready in {run.ready_seconds:.1f} s on 127.0.0.1:{run.port}; {len(run.ok)} answers"
            f"{f' ({failed} FAILED)' if failed else ''}, {run.token_count} tokens in {run.workload_seconds:.1f} s "
            f"(at most {run.most_concurrent} requests in flight); {stop}")


def _stats_table(document: dict[str, Any]) -> str:
    """The stats file's buckets and eager steps as vendor_graph's summary prints them."""
    from collections import Counter

    from vendor_graph.runtime import counters

    names = [f.name for f in dataclasses.fields(counters.BucketStats)]
    buckets = {int(size): counters.BucketStats(**{k: v for k, v in b.items() if k in names})
               for size, b in document.get("buckets", {}).items()}
    return counters.GraphStats(buckets=buckets, eager_steps=Counter(document.get("eager_steps", {}))).summary()


def _serve_demo(args: argparse.Namespace, model: str) -> int:
    """lmdeploy's OpenAI server under ``vendor-graph run`` on the vendor's simulated device, graph mode against
    ``--eager-mode``, each sent the same concurrent requests by the openai client and stopped with SIGTERM."""
    from . import serve

    start = time.perf_counter()
    device = _device(args, "server demo", f"vendor-graph run --vendor {args.vendor} -- lmdeploy serve api_server "
                     f"<model> --device {args.vendor}")
    vendor = device.vendor
    source = _dlinfer_source()
    from vendor_graph.upstream import compat

    version = compat.installed_lmdeploy_version()
    _check_lmdeploy(vendor, version)
    missing = [name for name in SERVER_NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(f"lmdeploy's server and its client need {', '.join(missing)}, not installed here: "
                         f"pip install -r requirements/lmdeploy-imports.txt (scripts/setup-env.sh does)")
    calls = serve.workload(args.seed, args.requests)
    clients = min(serve.CLIENTS, len(calls))
    lengths = sorted(c.max_tokens for c in calls)
    print(f"vendor_graph {__version__} demo --serve: lmdeploy {version}'s OpenAI server (lmdeploy serve api_server "
          f"--device {vendor} under vendor-graph run --vendor {vendor}) on {device.words}, dlinfer {source}",
          flush=True)
    print(f"{model} (random weights, word-level tokenizer), --max-batch-size {serve.MAX_BATCH_SIZE}; "
          f"{_requests(calls)} from {clients} concurrent openai clients: chat completions and completions, streamed "
          f"and not, greedy, {lengths[0]} to {lengths[-1]} new tokens (ignore_eos); loopback only\n", flush=True)
    runs = {}
    with tempfile.TemporaryDirectory(prefix="vendor-graph-serve-") as tmp:
        checkpoint = engine.write_model(model, Path(tmp) / model, args.seed)
        for graph, label in ((True, f"graph mode (vendor-graph run --vendor {vendor})"),
                             (False, "eager (--eager-mode)")):
            try:
                runs[graph] = serve.serve(checkpoint, Path(tmp) / ("graph" if graph else "eager"), calls,
                                          graph=graph, generation=device.switch, clients=clients, model_name=model)
            except serve.ServerError as exc:
                print(f"FAIL: the {label} server: {exc}")
                return 1
            print(f"{label}: {_served(runs[graph])}", flush=True)
    pair = serve.Pair(runs[True], runs[False])
    graph = pair.graph
    differences = pair.differences()
    chat = [a for a in graph.answers if a.token_ids is not None]
    print(f"\nAnswers of every request equal, graph mode vs eager: {'yes' if pair.equal else 'NO'} "
          f"({_requests(graph.answers)}: texts, and the token ids of the {len(chat)} chat completions; "
          f"{graph.token_count} tokens graph, {pair.eager.token_count} eager)")
    for line in differences[:5]:
        print(f"  {line}")
    document = graph.stats or {}
    runner = document.get("runner", "-")
    print(f"Runner lmdeploy built in its engine process: {runner} "
          f"({'vendor_graph' if runner.startswith('vendor_graph.') else 'NOT vendor_graph'}'s)")
    print(f"\nGraph stats of the graph-mode server (VENDOR_GRAPH_STATS_FILE, written by lmdeploy's engine process as "
          f"it exited after SIGTERM): {document.get('captures', 0)} captures, {document.get('replays', 0)} replays")
    if graph.stats_problem:
        print(f"  {graph.stats_problem}")
    if document:
        print(_stats_table(document))
        batches = sorted((int(b), n) for b, n in document.get("batch_histogram", {}).items())
        print(f"decode steps per batch size: {', '.join(f'{b}: {n}' for b, n in batches) or '-'} (graphs of "
              f"{', '.join(map(str, document.get('capture_sizes', []))) or '-'}; warm-up's captures included)")
    strays = [s for r in runs.values() if r.shutdown for s in r.shutdown.strays]
    problems = [text for failed, text in (
        (not pair.equal, "graph mode's answers are not eager's"),
        (not runner.startswith("vendor_graph."), "lmdeploy did not build vendor_graph's runner"),
        (not document.get("replays"), "vendor_graph's runner replayed no graph"),
        (bool(strays), f"processes left after SIGTERM: {strays}"),
    ) if failed]
    if problems:
        print(f"FAIL: {'; '.join(problems)}")
    first = next((c for c in calls if c.index == 0), None)
    if first is not None and graph.answers and graph.answers[0].text:
        print(f"\nRequest 0 ({first.endpoint}): {_words(first.prompt)}\n  -> {_words(graph.answers[0].text)}")
    seconds = time.perf_counter() - start
    print(f"\n{seconds:.1f} s in all (two servers started, served and stopped): the simulator is CPU emulation, not a "
          f"device speed")
    if args.json is not None:
        write_json(args.json, {
            "parity": pair.equal, "serve": True, "engine": True, "vendor": vendor, "backend": "sim",
            "lmdeploy": str(version), "generation": device.generation, "torch_npu": device.release, "model": model,
            "dlinfer": source, "seed": args.seed, "vendor_graph": __version__, "requests": len(calls),
            "clients": clients, "max_batch_size": serve.MAX_BATCH_SIZE, "tokens_equal": pair.equal,
            "differences": differences, "tokens": graph.token_count, "runner": runner,
            "captures": document.get("captures", 0), "graph_replays": document.get("replays", 0),
            "eager_steps": sum(document.get("eager_steps", {}).values()),
            "eager_reasons": document.get("eager_steps", {}), "batch_histogram": document.get("batch_histogram", {}),
            "capture_sizes": document.get("capture_sizes", []), "strays": strays,
            "servers": {r.mode: {"ready_seconds": r.ready_seconds, "workload_seconds": r.workload_seconds,
                                 "most_concurrent": r.most_concurrent,
                                 "shutdown": dataclasses.asdict(r.shutdown) if r.shutdown else None,
                                 "statuses": [a.status for a in r.answers]} for r in runs.values()},
            "seconds": round(seconds, 1),
        })
    return 1 if problems else 0


def _requests_bound() -> str:
    lengths = [r.max_new_tokens for r in engine.workload(0, requests=MAX_REQUESTS)]
    return (f"the requests decode {', '.join(map(str, lengths[:3]))} ... new tokens, so {MAX_REQUESTS} requests "
            f"already decode {sum(lengths)} tokens on the CPU emulation")


def add_command(sub: argparse._SubParsersAction) -> None:
    """The ``vendor_graph.commands`` entry point: adds ``demo`` to ``vendor-graph``."""
    demo = sub.add_parser("demo", help="lmdeploy's pipeline on the vendor's simulated device, eager and graph mode "
                                       "side by side (--model tiny: the simulator's tiny decoder)")
    demo.add_argument("--vendor", choices=VENDORS, default="ascend",
                      help="the simulated device lmdeploy's engine runs on: ascend's NPU, camb's MLU, maca's device")
    demo.add_argument("--model", choices=(*ENGINE_MODELS, DEMO_MODEL), default=None,
                      help="lmdeploy-llama (default) / lmdeploy-mla: served by lmdeploy's pipeline over the real "
                           "dlinfer (VENDOR_GRAPH_DLINFER_SRC or installed); tiny: the simulator's own decoder, step "
                           "by step")
    demo.add_argument("--generation", default="G5", type=generation_type,
                      help="simulated torch_npu (Ascend): a generation G0 ... G5 or a torch_npu release")
    demo.add_argument("--requests", default=None, type=count_type(
        "--requests", "the engine demo serves at least 1 request", REQUESTS, high=MAX_REQUESTS,
        why_high=_requests_bound()),
        help=f"engine: requests served, max_batch_size {MAX_BATCH_SIZE} (default {REQUESTS})")
    demo.add_argument("--steps", default=None, type=count_type(
        "--steps", "a PASS over no decode step would prove nothing", 64, high=MAX_STEPS, why_high=MAX_STEPS_WHY),
        help=f"tiny: decode steps (default 64, at most {MAX_STEPS})")
    demo.add_argument("--seqs", default=None, type=count_type(
        "--seqs", "the demo decodes at least 1 sequence", 20, high=MAX_SEQS, why_high=MAX_SEQS_WHY),
        help=f"tiny: sequences, its max_batch_size (default 20, at most {MAX_SEQS})")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--backend", choices=DEMO_BACKENDS, default=None,
                      help="tiny: where graphs are captured and replayed (sim: the CPU graph simulator, default)")
    demo.add_argument("--serve", action="store_true",
                      help="serve the requests through lmdeploy's OpenAI server (lmdeploy serve api_server under "
                           "vendor-graph run, on a loopback port) from concurrent openai clients, graph mode vs "
                           "--eager-mode, each server stopped with SIGTERM")
    demo.add_argument("--json", type=json_path_type, default=None, metavar="PATH",
                      help="also write the verdict and counts there as JSON")
    demo.set_defaults(handler=cmd_demo)
