"""lmdeploy's own engine and pipeline on the simulated NPU: what a user runs, end to end.

A tiny random-weight checkpoint (:func:`write_model`: the real-stack Llama or DeepSeek-V2 MLA, with a word-level
tokenizer and a generation config) is served by ``lmdeploy.pipeline(...)`` with ``device_type='ascend'`` (or
``'camb'`` / ``'maca'``: the device of the switch, :func:`simulated_vendor`): the
engine checks its environment, imports dlinfer, builds the model and its KV cache, warms up (capturing graphs),
schedules, prefills, decodes, samples and detokenises, on the simulated torch_npu of the simulator switch
(:mod:`vendor_graph_sim.boot`). :func:`run` serves one workload eager or in graph mode and reports the tokens,
the runner lmdeploy built and what it did; :func:`compare` puts an eager and a graph run side by side.

The process must see the simulated device before lmdeploy imports dlinfer: ``VENDOR_GRAPH_SIM`` set at interpreter
start, or :func:`switch_on` before anything imports ``torch_npu`` / ``torch_mlu`` / dlinfer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import itertools
import json
import random
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

MODELS = ("lmdeploy-llama", "lmdeploy-mla")
EXTRA_MODELS = ("lmdeploy-mixtral",)  # on request: a Mixtral, a routed MoE in every layer
BLOCK_SIZE = 16
SESSION_LEN = 512
FIXED_BLOCKS = 96
AUTO_CACHE_FRACTION = 0.0005  # of the simulated 64 GiB: thousands of blocks, sized by lmdeploy from free memory
SPECIAL = ("<pad>", "<s>", "</s>", "<unk>")  # ids 0-3: the checkpoints' pad, bos and eos are 0, 1 and 2


# -- the model a user would point the pipeline at -------------------------------------------------------------


def vocabulary(size: int) -> list[str]:
    """``size`` tokens: the special ones, then two-syllable words (``bako``, ``bami`` ...)."""
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    words = (a + b for a, b in itertools.product(syllables, repeat=2))
    return list(SPECIAL) + list(itertools.islice(words, size - len(SPECIAL)))


def write_model(model: str, directory: Path, seed: int = 0) -> Path:
    """A checkpoint lmdeploy can serve: ``model``'s random weights and config (:mod:`vendor_graph_sim.realstack`),
    a word-level tokenizer over its vocabulary, and a generation config."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from . import realstack

    checkpoint = realstack.write_checkpoint(model, Path(directory), seed)
    config = json.loads((checkpoint / "config.json").read_text())
    vocab = {word: i for i, word in enumerate(vocabulary(config["vocab_size"]))}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    # Decodes as no decoder does (words joined by spaces); xgrammar, which lmdeploy's engine builds over the
    # tokenizer, warns on stderr about a tokenizer.json without one.
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>")
    fast.save_pretrained(str(checkpoint))
    (checkpoint / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"],
         "pad_token_id": config["pad_token_id"]}))
    return checkpoint


# -- the workload -------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Request:
    prompt: str
    max_new_tokens: int


def workload(seed: int = 0, *, requests: int = 10, shared_prefix: int = 0, vocab_size: int = 384,
             prompt_words: int | None = None) -> list[Request]:
    """``requests`` prompts of different lengths (``prompt_words`` each, where given) that finish after different
    numbers of tokens (8 to 8 + 3 * (requests - 1)), so that with a smaller ``max_batch_size`` requests queue, join
    mid-run and leave: the decode batch shrinks inside a bucket and crosses buckets. ``shared_prefix`` words open
    every prompt (prefix caching reuses their blocks)."""
    rng = random.Random(seed)
    words = vocabulary(vocab_size)[len(SPECIAL):]
    prefix = [rng.choice(words) for _ in range(shared_prefix)]
    out = []
    for i in range(requests):
        length = rng.randint(3, 2 * BLOCK_SIZE + 5)
        body = [rng.choice(words) for _ in range(length if prompt_words is None else prompt_words)]
        out.append(Request(" ".join(prefix + body), 8 + 3 * i))
    return out


# -- running the pipeline -----------------------------------------------------------------------------------


@dataclasses.dataclass
class EngineRun:
    """One pipeline run: its settings, what it returned, and the graph runner lmdeploy built."""

    model: str
    mode: str  # "graph" or "eager"
    lmdeploy: str
    torch_npu: str  # the vendor runtime's version (torch_npu's; torch_mlu's on Camb; "" on MACA)
    executor: str
    tp: int
    max_batch_size: int
    prefix_caching: bool
    cache: str  # "fixed" or "from free memory"
    num_blocks: int = 0
    requests: int = 0
    tokens: list[list[int]] = dataclasses.field(default_factory=list)
    finish_reasons: list[str] = dataclasses.field(default_factory=list)
    texts: list[str] = dataclasses.field(default_factory=list)
    runner: str = ""  # the class lmdeploy built (module.qualname)
    vendor_graph_active: bool = False
    captures: int = 0
    replays: int = 0  # vendor_graph's runner: its stats; another runner: the simulator's graph replays
    eager_reasons: dict[str, int] = dataclasses.field(default_factory=dict)
    histogram: dict[str, int] = dataclasses.field(default_factory=dict)
    prefill_kernels: dict[str, int] = dataclasses.field(default_factory=dict)  # dlinfer's prefill kernels called
    prefill_cached_tokens: int = 0  # cached history the paged prefills attended to (over all layers)
    ranks: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # mp executor: each worker's stats file
    seconds: float = 0.0
    vendor: str = "ascend"  # lmdeploy's device_type
    # lmdeploy's CudaGraphMixin buffer methods in force after the generation: name -> the module that defined each
    buffer_methods: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def token_count(self) -> int:
        return sum(len(t) for t in self.tokens)


def switch_on(spec: str = "G5") -> None:
    """Turn the simulator switch on in this process (as ``VENDOR_GRAPH_SIM=spec`` at start would); before
    anything imports ``torch_npu`` (``torch_mlu``, dlinfer)."""
    import sys

    from . import boot

    early = {"torch_npu", "torch_mlu", "dlinfer"} & set(sys.modules)
    if early and boot.active() is None:
        raise RuntimeError(f"{', '.join(sorted(early))} is already imported in this process: turn the simulator "
                           f"switch on first (set {boot.ENV} before the interpreter starts)")
    boot.install(spec)


# the vendor of a run on this machine's real device (main's --real-device), where no simulator finder says it
_REAL_VENDOR: list[str] = []


def simulated_vendor() -> str:
    """The vendor of this process's device: the simulated one's (the switch's: ``ascend``, ``camb`` or ``maca``),
    or the real one's (:func:`vendor_graph_sim.boot.serve_vendor`, ``--real-device``)."""
    from . import boot

    finder = boot.active()
    if finder is not None and (finder.spec is not None or finder.on_real_device):
        return finder.vendor
    return _REAL_VENDOR[0] if _REAL_VENDOR else "ascend"


def on_real_device() -> bool:
    """Whether lmdeploy runs on this machine's real device (:func:`vendor_graph_sim.boot.serve_vendor`, or
    ``--real-device``: no simulator finder at all)."""
    from . import boot

    finder = boot.active()
    return bool(_REAL_VENDOR) or (finder is not None and finder.on_real_device)


def runtime_version(vendor: str) -> str:
    """The vendor runtime's version: torch_npu's, torch_mlu's, or "" for MACA (its torch is the runtime) and on an
    NVIDIA GPU standing in (:func:`vendor_graph_sim.boot.serve_vendor`)."""
    from . import boot

    finder = boot.active()
    if vendor == "maca" or (finder is not None and finder.on_real_device):
        return ""
    return getattr(importlib.import_module("torch_npu" if vendor == "ascend" else "torch_mlu"), "__version__", "?")


def _runner_name(runner: Any) -> str:
    cls = type(runner)
    return f"{cls.__module__}.{cls.__qualname__}"


BUFFER_METHODS = ("make_buffers_cudagraph", "fill_buffers_cudagraph", "update_context_cudagraph",
                  "get_outputs_cudagraph")


def buffer_methods_in_force() -> dict[str, str]:
    """Which module's function each of lmdeploy's ``CudaGraphMixin`` buffer methods is now (vendor_graph's, dlinfer's
    cudagraph patch, lmdeploy's own)."""
    from lmdeploy.pytorch.models.utils.cudagraph import CudaGraphMixin

    found = {}
    for name in BUFFER_METHODS:
        method = CudaGraphMixin.__dict__.get(name)
        method = getattr(method, "__func__", method)
        found[name] = getattr(method, "__module__", "?") if method is not None else ""
    return found


def _model_agent(pipe: Any) -> Any:
    return pipe.async_engine.engine.executor.model_agent


PREFILL_KERNELS = ("prefill_attention", "paged_prefill_attention")


@contextlib.contextmanager
def _counting_prefill_kernels(record: EngineRun) -> Iterator[None]:
    """Count the calls of dlinfer's vendor prefill kernels (without and with cached history) for the block, and the
    cached tokens the paged prefills attended to without computing them (prefix caching's reuse): the registry
    ``dlinfer.ops`` looks each kernel up in at every call."""
    import inspect

    from dlinfer.vendor import vendor_ops_registry as registry

    saved = {name: registry[name] for name in PREFILL_KERNELS if name in registry}

    def counted(name: str, kernel: Any) -> Any:
        signature = inspect.signature(kernel)

        def call(*args: Any, **kwargs: Any) -> Any:
            record.prefill_kernels[name] = record.prefill_kernels.get(name, 0) + 1
            if name == "paged_prefill_attention":
                bound = signature.bind(*args, **kwargs).arguments
                kv = bound["kv_seq_len"]
                kv_total = sum(kv.tolist() if hasattr(kv, "tolist") else kv)
                record.prefill_cached_tokens += int(kv_total) - int(bound["query"].shape[0])
            return kernel(*args, **kwargs)

        return call

    registry.update({name: counted(name, kernel) for name, kernel in saved.items()})
    try:
        yield
    finally:
        registry.update(saved)


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    """``os.environ`` with ``values`` for the block: what the processes lmdeploy spawns in it inherit."""
    import os

    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _worker_stats(base: Path) -> list[dict[str, Any]]:
    """The stats files lmdeploy's workers wrote at exit for ``base`` (one per rank), by rank."""
    from vendor_graph.sizing.workload import stats_files

    documents = [json.loads(path.read_text()) for path in stats_files(base)]
    return sorted(documents, key=lambda d: d.get("rank", 0))


def _record_runner(record: EngineRun, document: dict[str, Any], captures: int, replays: int,
                   eager_reasons: dict[str, int]) -> None:
    record.captures, record.replays, record.eager_reasons = captures, replays, dict(eager_reasons)
    record.histogram = {str(k): v for k, v in document.get("batch_histogram", {}).items()}


def run(model_dir: Path, *, model: str, graph: bool, requests: Sequence[Request], max_batch_size: int = 6,
        prefix_caching: bool = False, cache_from_memory: bool = False, executor: str = "uni",
        tp: int = 1) -> EngineRun:
    """Serve ``requests`` through ``lmdeploy.pipeline`` (the simulated vendor, greedy, ``ignore_eos``) and close it.

    ``executor="mp"`` (and every ``tp`` > 1) runs the model in processes lmdeploy spawns: they see the simulated
    NPU through the switch's environment, vendor_graph activates itself in them (its autoload), and what their
    runners did comes from the stats file each rank writes at exit (:attr:`EngineRun.ranks`; rank 0's in the
    other fields). With ``tp`` > 1 each worker selects its card (``set_device(rank)``) and lmdeploy's device groups
    are the simulator's ``hccl`` (:mod:`.device._hccl`, over gloo on loopback, captured into the graphs), beside
    lmdeploy's own gloo CPU groups."""
    import lmdeploy
    import torch
    from lmdeploy import GenerationConfig, PytorchEngineConfig, pipeline

    import vendor_graph
    from vendor_graph.ops import reports

    from . import device as sim

    in_workers = executor != "uni" or tp > 1
    vendor = simulated_vendor()
    record = EngineRun(model=model, mode="graph" if graph else "eager", lmdeploy=lmdeploy.__version__,
                       torch_npu="", executor=executor, tp=tp,
                       max_batch_size=max_batch_size, prefix_caching=prefix_caching,
                       cache="from free memory" if cache_from_memory else "fixed", requests=len(requests),
                       vendor=vendor)
    config = PytorchEngineConfig(
        device_type=vendor, eager_mode=not graph, max_batch_size=max_batch_size, block_size=BLOCK_SIZE,
        session_len=SESSION_LEN, enable_prefix_caching=prefix_caching, distributed_executor_backend=executor, tp=tp,
        num_gpu_blocks=0 if cache_from_memory else FIXED_BLOCKS,
        cache_max_entry_count=AUTO_CACHE_FRACTION if cache_from_memory else 0.8)
    gen = [GenerationConfig(top_k=1, do_sample=False, ignore_eos=True, max_new_tokens=r.max_new_tokens)
           for r in requests]
    replays_before = sim.counters.replays
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vendor_graph-workers-") as workers:
        worker_stats = Path(workers) / "stats.json"
        spawn_env = {"VENDOR_GRAPH_STATS_FILE": str(worker_stats)} if in_workers else {}
        with _environment(**spawn_env):
            pipe = pipeline(str(model_dir), backend_config=config, log_level="ERROR")  # lmdeploy's log: errors only
        try:
            with _counting_prefill_kernels(record):
                outputs = pipe([r.prompt for r in requests], gen_config=gen)
            record.buffer_methods = buffer_methods_in_force()
            agent = None if in_workers else _model_agent(pipe)
            runner = getattr(agent, "patched_model", None)
            record.runner = _runner_name(runner) if runner is not None else ""
            record.num_blocks = int(getattr(getattr(agent, "cache_config", None), "num_gpu_blocks", 0) or 0)
            record.vendor_graph_active = vendor_graph.active_vendor() is not None
            if runner is not None and hasattr(runner, "stats"):
                _record_runner(record, reports.runner_document(runner), runner.stats.captures, runner.stats.replays,
                               runner.stats.eager_steps)
            elif not in_workers:
                record.replays = sim.counters.replays - replays_before
        finally:
            pipe.close()
        if in_workers:  # the workers have exited: their stats files are complete
            record.ranks = _worker_stats(worker_stats)
            if record.ranks:
                first = record.ranks[0]
                record.runner = first.get("runner", "")
                _record_runner(record, first, first["captures"], first["replays"], first["eager_steps"])
    record.seconds = round(time.perf_counter() - start, 2)
    record.torch_npu = runtime_version(vendor)
    if on_real_device():
        torch.cuda.synchronize()
    else:
        sim.synchronize()
    for out in outputs:
        record.tokens.append(list(out.token_ids))
        record.finish_reasons.append(str(out.finish_reason))
        record.texts.append(out.text)
    return record


@dataclasses.dataclass
class Comparison:
    """An eager and a graph run of the same workload."""

    eager: EngineRun
    graph: EngineRun

    @property
    def tokens_equal(self) -> bool:
        return self.eager.tokens == self.graph.tokens and self.eager.token_count > 0

    def first_difference(self) -> str | None:
        for i, (a, b) in enumerate(zip(self.eager.tokens, self.graph.tokens, strict=False)):
            if a != b:
                at = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
                return f"request {i}, token {at}: eager {a[at:at + 4]}, graph {b[at:at + 4]}"
        if len(self.eager.tokens) != len(self.graph.tokens):
            return f"{len(self.eager.tokens)} eager responses, {len(self.graph.tokens)} graph responses"
        return None


def compare(model: str, *, workdir: Path | None = None, seed: int = 0, requests: int = 10, max_batch_size: int = 6,
            prefix_caching: bool = False, cache_from_memory: bool = False, executor: str = "uni",
            tp: int = 1, eager_tp: int | None = None, prompt_words: int | None = None) -> Comparison:
    """:func:`run` eager, then in graph mode, on one checkpoint of ``model`` and one workload (the eager run with
    ``eager_tp`` ranks, default ``tp``: a tensor-parallel graph run against a one-card eager run)."""
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        checkpoint = write_model(model, Path(tmp) / model, seed)
        load = workload(seed, requests=requests, shared_prefix=2 * BLOCK_SIZE + 3 if prefix_caching else 0,
                        prompt_words=prompt_words)
        kwargs = dict(model=model, requests=load, max_batch_size=max_batch_size, prefix_caching=prefix_caching,
                      cache_from_memory=cache_from_memory)
        eager_tp = tp if eager_tp is None else eager_tp
        eager = run(checkpoint, graph=False, executor=executor if eager_tp == tp else "uni", tp=eager_tp, **kwargs)
        graph = run(checkpoint, graph=True, executor=executor, tp=tp, **kwargs)
    return Comparison(eager, graph)


# -- one process of runs (a user's script; the conformance tests run one per generation) ------------------------

CASES = {  # name -> compare() options
    "basic": {},
    "prefix-auto": {"prefix_caching": True, "cache_from_memory": True},
    # every prompt as long as the others: dlinfer's MACA MLA prefill views the batch as (batch, seq, heads, dim)
    "equal-prompts": {"prompt_words": 12},
}


RUNNERS = {
    "vendor_graph": "import vendor_graph.<vendor> first, as the README says",
    "dlinfer": "vendor_graph not imported; only its bridges installed, so that the engine starts on this stack and "
               "dlinfer's own runner serves the graphs (Ascend: its AscendGraphRunner; Camb, MACA: lmdeploy's CUDA "
               "runner with dlinfer's cudagraph patches)",
    "dlinfer-bare": "nothing of vendor_graph: lmdeploy and dlinfer as they are",
}


def install_bridges_alone(vendor: str = "ascend") -> Any:
    """vendor_graph's bridges without vendor_graph (:data:`RUNNERS` ``dlinfer``); returns what lists the names of
    those installed so far (a bridge installs when the module it fixes is imported)."""
    from vendor_graph.install import bridges, patching

    alone = patching.Activation(vendor=vendor)
    bridges.install(alone)

    def names() -> list[str]:
        return sorted({record.name for record in bridges.applied(alone)})

    return names


#: How long :func:`main` lets its runs take before it ends the process (``--timeout``).
TIMEOUT_S = 900.0


def _watchdog(seconds: float) -> Any:
    """End this process with status 124 and a message (and every thread's stack) when the runs have not finished
    within ``seconds``, after terminating the worker processes lmdeploy spawned: lmdeploy's engine waits for its
    workers without a bound, and a worker whose forward loop failed (lmdeploy keeps the failed task's exception to
    itself; the worker lives on, idle) or a collective that never completes would otherwise hold it forever."""
    import faulthandler
    import multiprocessing
    import os
    import sys
    import threading

    def expire() -> None:
        print(f"vendor_graph_sim.engine: the runs did not finish within {seconds:g} s: an engine is hung (a "
              "worker's forward loop may have failed inside lmdeploy, which does not report it, or a collective "
              "never completed); ending it and its workers. The threads of this process:", file=sys.stderr,
              flush=True)
        faulthandler.dump_traceback(all_threads=True)
        for child in multiprocessing.active_children():
            child.kill()  # a worker held in a collective would not take SIGTERM (lmdeploy's handler) before it ends
        os._exit(124)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    return timer


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m vendor_graph_sim.engine OUT.json [--models ...] [--cases ...] [--runner ...]``: eager and graph
    runs of each model and case in this process, as a user's script runs them: ``import vendor_graph.ascend``
    first (``--runner vendor_graph``), then lmdeploy's pipeline. The simulated NPU is the switch's
    (``VENDOR_GRAPH_SIM``, default G5 here)."""
    import argparse
    import os
    import sys
    import traceback

    parser = argparse.ArgumentParser(prog="python -m vendor_graph_sim.engine")
    parser.add_argument("out", type=Path)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=(*MODELS, *EXTRA_MODELS))
    parser.add_argument("--cases", nargs="+", default=["basic"], choices=sorted(CASES))
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--max-batch-size", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--executor", choices=("uni", "mp"), default="uni",
                        help="lmdeploy's distributed_executor_backend: mp runs the model in spawned workers")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (mp executor)")
    parser.add_argument("--eager-tp", type=int, default=None, help="ranks of the eager run (default --tp)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S,
                        help="seconds the runs may take before the process ends with status 124 (a hang)")
    parser.add_argument("--real-device", choices=("ascend", "camb", "maca"), default=None,
                        help="run on this machine's device of that vendor (its runtime and dlinfer installed), not on "
                             "the simulator: the hardware workflows' engine conformance")
    parser.add_argument("--runner", choices=sorted(RUNNERS), default="vendor_graph",
                        help="; ".join(f"{k}: {v}" for k, v in RUNNERS.items()))
    args = parser.parse_args(argv)
    watchdog = _watchdog(args.timeout)
    if args.real_device is None:
        switch_on(os.environ.get("VENDOR_GRAPH_SIM", "").strip() or "G5")
    else:
        _REAL_VENDOR[:] = [args.real_device]
    vendor = simulated_vendor()
    if args.runner == "vendor_graph":
        importlib.import_module(f"vendor_graph.{vendor}")  # the user's `import vendor_graph.ascend`, before lmdeploy
        from vendor_graph.install import bridges

        applied = lambda: sorted({b.name for b in bridges.applied()})  # noqa: E731
    elif args.runner == "dlinfer":
        applied = install_bridges_alone(vendor)
    else:
        applied = lambda: []  # noqa: E731

    results: list[dict[str, Any]] = []
    for model in args.models:
        for case in args.cases:
            entry: dict[str, Any] = {"model": model, "case": case}
            try:
                c = compare(model, seed=args.seed, requests=args.requests, max_batch_size=args.max_batch_size,
                            executor=args.executor, tp=args.tp, eager_tp=args.eager_tp, **CASES[case])
                entry.update(eager=dataclasses.asdict(c.eager), graph=dataclasses.asdict(c.graph),
                             tokens_equal=c.tokens_equal, first_difference=c.first_difference())
            except Exception as exc:  # noqa: BLE001 - recorded: what this stack does is the finding
                entry["error"] = f"{type(exc).__name__}: {exc}"
                entry["traceback"] = traceback.format_exc()[-3000:]
            results.append(entry)
    import lmdeploy

    from . import boot

    args.out.write_text(json.dumps({
        "lmdeploy": lmdeploy.__version__, "vendor": vendor, "torch_npu": runtime_version(vendor),
        "simulated": None if args.real_device else os.environ.get(boot.ENV, "G5"), "runner": args.runner,
        "bridges": applied(),
        "results": results}, indent=1))
    watchdog.cancel()
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
