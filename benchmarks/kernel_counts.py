"""Kernel launches per buffer fill and per whole replay step, vendor_graph.cuda against lmdeploy's own
CUDA graph runner, on the same model and the same inputs, in one process, with the PyTorch profiler.

    python benchmarks/kernel_counts.py run MODEL_DIR OUT.json     # GPU, lmdeploy 0.18 (engine_tpot.py gen MODEL_DIR)
    python benchmarks/kernel_counts.py dry OUT.json               # CPU: the same code on the simulator (see below)
    python benchmarks/kernel_counts.py selftest                   # CPU: the trace accounting on a synthetic trace

The model is lmdeploy's own: ``Engine.from_pretrained`` on the random-weight Llama of ``engine_tpot.py
gen``, with ``import vendor_graph.cuda`` first, so lmdeploy builds its ``LlamaForCausalLM`` through
``ModelConfig`` / ``build_patched_model`` / ``load_model_weights`` on the CUDA backend (Triton attention),
its cache engine and its graph runner, adopted by vendor_graph, and warms it up (every capture size
captured). The engine loop is never started: steps are driven the way ``model_agent.model_forward``
runs them (``StepContextManager.build_context`` -> ``prepare_inputs_for_generation`` -> the runner),
from hand-made decode ``ModelInputs`` (seeded KV lengths 40..167, distinct blocks, no adapters: what a
serving step passes).

The two arms share that model object, its weights and KV cache:

* ``vendor``: the engine's runner (lmdeploy's ``CUDAGraphRunner`` adopted by vendor_graph; the
  ``CudaGraphMixin`` buffer methods are vendor_graph.cuda's, patched on the class);
* ``lmdeploy``: a second, plain ``CUDAGraphRunner`` built on the same model, whose steps see lmdeploy's
  own (unpatched) ``CudaGraphMixin`` methods: the functions vendor_graph's patches replaced, bound on
  the model *instance* while that arm runs (an instance attribute shadows the class), removed again for
  the vendor arm. vendor_graph's class patches stay in place throughout (its ownership checks pass).

Why this option: it is lmdeploy's real model, op backend, attention metadata and runner for both arms,
exactly as the engine runs them, differing only in the buffer methods and vendor_graph's policy;
the decode_bench model cannot be driven by lmdeploy's own fill (its Camb attention reads buffers
lmdeploy's fill does not write), and two engines (one per arm) would not share weights, cache or
process.

Measured per arm at each batch (1, 8, 64: capture sizes, so no padding): with ``torch.profiler``
(CPU + CUDA activities), per call of (i) the buffer fill (``CUDASingleGraphRunner._bind_inputs``:
``fill_buffers_cudagraph`` + ``update_context_cudagraph``), (ii) the whole replay step (the runner's
``__call__`` on a captured key), (iii) a bare ``CUDAGraph.replay()``: kernels launched outside the graph,
memcpy and memset operations, kernels run by the graph launch, and the runtime / driver API calls by
name (launches, copies, syncs). Then the step and bare-replay times in alternating rounds (per-round
medians, paired differences), the host-time phase split of each arm's step, and whether both arms'
hidden states agree.

``dry``: the decode benchmark's tiny Camb model on the CPU simulator (lmdeploy 0.17 on the path) stands
in for the engine, and the "lmdeploy" arm binds vendor_graph's own methods (lmdeploy's fill launches a
Triton kernel, which has no CPU build): it exercises the arm switching, the second runner, the
regions, the accounting and the JSON, not lmdeploy's fill; the simulator's device-op counts stand in
for the CUDA ones.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
import traceback
import types
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _phases  # noqa: E402
import _stats  # noqa: E402

BATCHES = (1, 8, 64)
SEED = 0
PROFILE_STEPS = 5  # profiled calls per arm, batch and kind
ROUNDS, PER_ROUND = 12, 15  # timing: alternating rounds per batch, (step, bare) pairs per arm and round
PHASE_STEPS = 100
MIXIN_METHODS = ("make_buffers_cudagraph", "fill_buffers_cudagraph", "update_context_cudagraph",
                 "support_cuda_graph")
ARMS = ("vendor", "lmdeploy")
KINDS = ("fill", "step", "bare")


# -- the trace accounting ------------------------------------------------------------------------------

_HOST_CATS = ("cuda_runtime", "cuda_driver", "runtime", "driver")


def _api_kind(name: str) -> str:
    n = name.lower()
    if "graphlaunch" in n:
        return "graph_launch"
    if "launchkernel" in n or "launchcooperativekernel" in n:
        return "kernel_launch"
    if "memcpy" in n:
        return "memcpy"
    if "memset" in n:
        return "memset"
    if "synchronize" in n:
        return "sync"
    return "other"


def count_trace(trace: dict, prefix: str = "vgk|", end_prefix: str = "vgkend|") -> dict[str, list[dict]]:
    """Per region label (user annotations named ``prefix + label + '|' + i``): one dict per call with the
    device activities it caused and the host API calls it made. A host call belongs to the region whose
    span holds its start; a device activity to the host call with its correlation id. A device activity
    whose correlation matches no recorded host call (a launch API the profiler did not record) belongs to
    the region whose window holds its start: from the region's start to its end marker (an annotation
    ``end_prefix + label + '|' + i`` made after the device finished the region's work; without one, the
    region's own end); those are also counted as ``uncorrelated``."""
    import bisect

    events = [e for e in trace.get("traceEvents", trace if isinstance(trace, list) else []) if isinstance(e, dict)]
    regions, ends = [], {}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") != "user_annotation":
            continue
        name = str(e.get("name", ""))
        for pre, is_end in ((end_prefix, True), (prefix, False)):
            if name.startswith(pre):
                label, _, index = name[len(pre):].rpartition("|")
                if is_end:
                    ends[(label, int(index))] = float(e["ts"])
                else:
                    regions.append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), label, int(index)))
                break
    regions.sort()
    calls: dict[tuple, dict] = {}
    for _start, _end, label, index in regions:
        calls[(label, index)] = {"api": Counter(), "kernels": 0, "graph_kernels": 0, "memcpy": 0, "memset": 0,
                                 "memcpy_kinds": Counter(), "kernel_names": Counter(), "uncorrelated": 0}
    starts = [r[0] for r in regions]

    def region_at(ts: float, window: bool):
        i = bisect.bisect_right(starts, ts) - 1
        if i < 0:
            return None
        start, end, label, index = regions[i]
        if window:
            end = max(end, ends.get((label, index), end))
        return (label, index) if start <= ts <= end else None

    by_corr: dict[Any, tuple[str, tuple]] = {}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in _HOST_CATS:
            continue
        key = region_at(float(e["ts"]), window=False)
        if key is None:
            continue
        calls[key]["api"][e["name"]] += 1
        corr = (e.get("args") or {}).get("correlation")
        if corr is not None:
            by_corr[corr] = (e["name"], key)
    host_corrs = {(e.get("args") or {}).get("correlation") for e in events
                  if e.get("ph") == "X" and e.get("cat") in _HOST_CATS} - {None}
    for e in events:
        cat = e.get("cat")
        if e.get("ph") != "X" or cat not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        corr = (e.get("args") or {}).get("correlation")
        hit = by_corr.get(corr)
        if hit is None:
            if corr in host_corrs:  # launched by a host call outside every region
                continue
            key = region_at(float(e["ts"]), window=True)
            if key is None:
                continue
            api = "?"
            calls[key]["uncorrelated"] += 1
        else:
            api, key = hit
        rec = calls[key]
        if cat == "gpu_memcpy":
            rec["memcpy"] += 1
            rec["memcpy_kinds"][e.get("name", "?")] += 1
        elif cat == "gpu_memset":
            rec["memset"] += 1
        elif _api_kind(api) == "graph_launch":
            rec["graph_kernels"] += 1
        else:
            rec["kernels"] += 1
            rec["kernel_names"][str(e.get("name", "?"))[:120]] += 1
    out: dict[str, list[dict]] = {}
    for (label, index), rec in sorted(calls.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        api_kinds = Counter()
        for name, n in rec["api"].items():
            api_kinds[_api_kind(name)] += n
        out.setdefault(label, []).append({
            "index": index, "kernels": rec["kernels"], "memcpy": rec["memcpy"], "memset": rec["memset"],
            "graph_kernels": rec["graph_kernels"], "uncorrelated": rec["uncorrelated"], "api_kinds": dict(api_kinds),
            "api": dict(rec["api"]), "memcpy_kinds": dict(rec["memcpy_kinds"]),
            "kernel_names": dict(rec["kernel_names"])})
    return out


def summarise_counts(per_call: list[dict]) -> dict:
    """Median (and min/max) per call of each count over the profiled calls of one region label."""
    def med(key: str, sub: str | None = None) -> dict:
        vals = [(c[key].get(sub, 0) if sub else c[key]) for c in per_call]
        return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}

    kinds = sorted({k for c in per_call for k in c["api_kinds"]})
    names = Counter()
    for c in per_call:
        names.update(c["kernel_names"])
    memcpy_kinds = Counter()
    for c in per_call:
        memcpy_kinds.update(c["memcpy_kinds"])
    api = Counter()
    for c in per_call:
        api.update(c["api"])
    n = len(per_call)
    return {"calls": n, "kernels": med("kernels"), "memcpy": med("memcpy"), "memset": med("memset"),
            "graph_kernels": med("graph_kernels"), "uncorrelated": med("uncorrelated"),
            "api_kinds": {k: med("api_kinds", k) for k in kinds},
            "kernel_names_per_call": {k: v / n for k, v in names.most_common(20)},
            "memcpy_kinds_per_call": {k: v / n for k, v in memcpy_kinds.items()},
            "api_per_call": {k: v / n for k, v in api.most_common(30)}}


def selftest() -> None:
    """The accounting on a synthetic trace: two regions, one with a fill kernel + memset, one with a
    graph launch of 3 kernels and a pageable HtoD copy."""
    ev = []

    def X(cat, name, ts, dur=1.0, corr=None):  # noqa: N802
        ev.append({"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1,
                   "args": {} if corr is None else {"correlation": corr}})

    X("user_annotation", "vgk|vendor/1/fill|0", 10, 10)
    X("cuda_runtime", "cudaLaunchKernel", 11, corr=1)
    X("cuda_runtime", "cudaMemsetAsync", 12, corr=2)
    X("kernel", "void at::native::foreach_copy", 30, corr=1)
    X("gpu_memset", "Memset (Device)", 31, corr=2)
    X("user_annotation", "vgk|vendor/1/step|0", 40, 20)
    X("cuda_driver", "cuLaunchKernelEx", 41, corr=3)
    X("cuda_runtime", "cudaGraphLaunch", 42, corr=4)
    X("cuda_runtime", "cudaMemcpyAsync", 43, corr=5)
    X("cuda_runtime", "cudaLaunchKernel", 70, corr=6)  # outside every region
    X("kernel", "_fill_graph_common_inputs_kernel", 50, corr=3)
    for t in (51, 52, 53):
        X("kernel", "graph kernel", t, corr=4)
    X("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 54, corr=5)
    X("kernel", "late", 80, corr=6)
    X("kernel", "triton kernel, launch not recorded", 61, corr=99)  # after the region, before its end marker
    X("user_annotation", "vgkend|vendor/1/step|0", 65, 0.1)
    X("kernel", "another stray", 66, corr=98)  # after the end marker: nobody's
    got = count_trace({"traceEvents": ev})
    fill, step = got["vendor/1/fill"][0], got["vendor/1/step"][0]
    assert (fill["kernels"], fill["memset"], fill["memcpy"], fill["graph_kernels"]) == (1, 1, 0, 0), fill
    assert (step["kernels"], step["graph_kernels"], step["memcpy"], step["uncorrelated"]) == (2, 3, 1, 1), step
    assert step["api_kinds"] == {"kernel_launch": 1, "graph_launch": 1, "memcpy": 1}, step
    s = summarise_counts(got["vendor/1/step"])
    assert s["graph_kernels"]["median"] == 3 and s["kernels"]["median"] == 2, s
    # a real (CPU-only) profiler trace parses, with no device activity
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("vgk|cpu/1/step|0"):
            torch.ones(4).add_(1)
    trace = _export(prof)
    got = count_trace(trace)
    assert got["cpu/1/step"][0]["kernels"] == 0, got
    print("selftest ok")


def _export(prof) -> dict:
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            return json.load(f)
    finally:
        os.unlink(path)


# -- the two arms ----------------------------------------------------------------------------------------

def lmdeploy_mixin_originals() -> dict[str, Any]:
    """lmdeploy's own ``CudaGraphMixin`` functions that vendor_graph's active patches replaced."""
    from vendor_graph.install import patching

    activation = patching.active()
    if activation is None:
        raise RuntimeError("no vendor_graph activation: nothing to take lmdeploy's methods back from")
    out = {}
    for p in activation.patches:
        if getattr(p.owner, "__name__", "") == "CudaGraphMixin" and p.name in MIXIN_METHODS:
            if p.before is patching._MISSING:
                raise RuntimeError(f"CudaGraphMixin.{p.name} had no own definition before vendor_graph")
            out[p.name] = p.before
    missing = set(MIXIN_METHODS) - set(out)
    if missing:
        raise RuntimeError(f"vendor_graph did not patch CudaGraphMixin.{sorted(missing)}")
    return out


class Stack:
    """The model, both runners and fresh decode-step kwargs per batch; subclasses build them."""

    model: Any
    runners: dict[str, Any]
    real: bool
    pins: dict[str, Any]  # the lmdeploy arm's methods, bound on the model instance while it runs

    def use(self, arm: str) -> None:
        for name in MIXIN_METHODS:
            self.model.__dict__.pop(name, None)
        if arm == "lmdeploy":
            for name, fn in self.pins.items():
                self.model.__dict__[name] = types.MethodType(fn, self.model)

    def sync(self) -> None:
        if self.real:
            import torch

            torch.cuda.synchronize()

    def graph_of(self, arm: str, batch: int):
        from vendor_graph.upstream import compat

        graphs = compat.cuda_runner_graphs(self.runners[arm])
        fits = sorted((k for k in graphs if k[0] >= batch and k[1]), key=lambda k: k[0])
        if not fits:
            raise RuntimeError(f"{arm}: no graph for batch {batch} (keys {sorted(graphs)})")
        return graphs[fits[0]]

    @contextlib.contextmanager
    def step_kwargs(self, batch: int):  # pragma: no cover - per stack
        raise NotImplementedError
        yield

    def close(self) -> None:
        pass


class EngineStack(Stack):
    """lmdeploy 0.18's engine on the GPU (see the module docstring)."""

    real = True

    def __init__(self, model_dir: str, batches: tuple[int, ...]):
        from lmdeploy import PytorchEngineConfig
        from lmdeploy.pytorch.engine import Engine
        from lmdeploy.pytorch.models.utils import cudagraph  # noqa: F401  (the mixin patch fires on import)

        import vendor_graph.cuda  # noqa: F401  (before lmdeploy builds anything)
        from vendor_graph.runtime.adopted import AdoptedRunner
        from vendor_graph.upstream import compat

        self.pins = lmdeploy_mixin_originals()
        start = time.perf_counter()
        cfg = PytorchEngineConfig(device_type="cuda", max_batch_size=max(batches), cache_max_entry_count=0.05,
                                  session_len=2048, dtype="bfloat16")
        self.engine = Engine.from_pretrained(model_dir, engine_config=cfg)
        self.build_s = time.perf_counter() - start
        agent = self.agent = self.engine.executor.model_agent
        vendor = agent.patched_model
        if not isinstance(vendor, AdoptedRunner):
            raise RuntimeError(f"the engine's runner is {type(vendor).__qualname__}, not vendor_graph's")
        self.model = vendor.model
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(agent.all_context())
        import torch

        self._stack.enter_context(torch.cuda.stream(agent.stream))
        self.use("lmdeploy")  # the plain runner binds support_cuda_graph when built
        plain = compat.cuda_graph_runner_class()(self.model, agent.model_config, agent.cache_config,
                                                 agent.backend_config, agent.device)
        self.use("vendor")
        self.runners = {"vendor": vendor, "lmdeploy": plain}
        self.inputs = {b: self._decode_inputs(b) for b in batches}

    def _decode_inputs(self, batch: int):
        import torch

        agent = self.agent
        block = agent.cache_config.block_size
        rng = random.Random(SEED * 1000 + batch)
        history = [rng.randrange(40, 168) for _ in range(batch)]  # KV lengths 41..168 after this token
        blocks = [-(-(h + 1) // block) for h in history]
        width = max(blocks)
        if 1 + sum(blocks) > agent.cache_config.num_gpu_blocks:
            raise RuntimeError(f"{sum(blocks)} blocks needed, {agent.cache_config.num_gpu_blocks} in the cache")
        table, nxt = [], 1  # block 0 stays free, as lmdeploy's block manager keeps it
        for n in blocks:
            table.append(list(range(nxt, nxt + n)) + [0] * (width - n))
            nxt += n
        dummy = agent.inputs_strategy.make_dummy(batch, is_decoding=True, device="cuda",
                                                 vocab_size=agent.model_config.vocab_size, meta=agent.make_dummy_meta)
        g = torch.Generator().manual_seed(SEED + batch)
        ids = torch.randint(4, agent.model_config.vocab_size, (1, batch), generator=g)
        return dummy.clone(
            input_ids=ids.cuda(), history_lengths=torch.tensor(history, dtype=torch.long).cuda(),
            block_offsets=torch.tensor(table, dtype=torch.long).cuda(), max_kv_seqlen=max(history) + 1,
            sum_kv_seqlen=sum(history) + batch, local_adapter_ids=None, is_dummy=False)

    @contextlib.contextmanager
    def step_kwargs(self, batch: int):
        from lmdeploy.pytorch.model_inputs import step_ctx_manager

        agent, model = self.agent, self.model
        ce, sce = agent.cache_engine, agent.state_cache_engine
        ctx_mgr = model.ctx_mgr
        with step_ctx_manager(ctx_mgr):
            context = ctx_mgr.build_context(inputs=self.inputs[batch], model_config=agent.model_config,
                                            cache_config=ce.cache_config, kv_caches=ce.gpu_cache,
                                            state_caches=sce.state_caches, kv_quant_policy=ce.cache_config.quant_policy)
            context.block_caches = ce.block_caches
            context.named_state_caches = sce.named_state_caches
            with ctx_mgr.context(context):
                if hasattr(model, "update_model_metas"):
                    model.update_model_metas(past_key_values=ce.gpu_cache, context=context)
                yield model.prepare_inputs_for_generation(past_key_values=ce.gpu_cache, context=context)

    def close(self) -> None:
        self._stack.close()


class SimStack(Stack):
    """The dry run: decode_bench's tiny Camb model on the CPU simulator (lmdeploy 0.17)."""

    real = False

    def __init__(self, batches: tuple[int, ...]):
        import decode_bench as db

        from vendor_graph.upstream import compat

        self.db = db
        self.bench = db.Bench("sim", db.model_config("tiny", max(batches), False), max(batches))
        self.model = self.bench.model
        self.lmdeploy_originals = lmdeploy_mixin_originals()  # checked, not used (lmdeploy's fill needs triton)
        cls = type(self.model)
        self.pins = {name: getattr(cls, name) for name in MIXIN_METHODS}  # vendor_graph's: see the docstring
        c = self.bench.configs
        self.use("lmdeploy")
        import torch

        plain = compat.cuda_graph_runner_class()(self.model, c.model_config, c.cache_config, c.backend_config,
                                                 torch.device(self.bench.where))
        self.use("vendor")
        self.runners = {"vendor": self.bench.runner, "lmdeploy": plain}
        self.build_s = 0.0

    @contextlib.contextmanager
    def step_kwargs(self, batch: int):
        yield self.db.tm.forward_kwargs(self.bench.context(batch))

    def close(self) -> None:
        self.bench.close()


# -- the measurements ------------------------------------------------------------------------------------

def _first_tensor(out):
    if isinstance(out, dict):
        out = out.get("hidden_states")
    return out


def _bind(single, kwargs: dict) -> Any:
    """What the graph's replay does before ``replay()``: fill, then bind the step context (0.18's
    ``_bind_inputs``; the same two calls inline in 0.17's ``forward``)."""
    if hasattr(single, "_bind_inputs"):
        return single._bind_inputs(**kwargs)
    padded = single.model.fill_buffers_cudagraph(single.meta, **kwargs)
    single.model.update_context_cudagraph(single.meta, single.ctx_mgr.current_context())
    return padded


def _call(stack: Stack, arm: str, kind: str, batch: int, kwargs: dict) -> Any:
    if kind == "fill":
        return _bind(stack.graph_of(arm, batch), kwargs)
    if kind == "step":
        return stack.runners[arm](**kwargs)
    return stack.graph_of(arm, batch)._graph.replay()


def warm(stack: Stack, batches, log) -> dict:
    """Capture lmdeploy's arm (the engine's warm-up captured the vendor's) and compare hidden states."""
    agree = {}
    vendor = stack.runners["vendor"]
    for batch in batches:
        replays0 = vendor.stats.replays if hasattr(vendor, "stats") else None
        eager0 = sum(vendor.stats.eager_steps.values()) if hasattr(vendor, "stats") else None
        outs = {}
        for arm in ARMS:
            stack.use(arm)
            for _ in range(3):  # the lmdeploy arm captures on its first call
                with stack.step_kwargs(batch) as kw:
                    out = _first_tensor(stack.runners[arm](**kw))
                    outs[arm] = out[..., :batch, :].float().clone() if out is not None else None
            stack.sync()
        a, b = outs["vendor"], outs["lmdeploy"]
        diff = None if a is None or b is None else float((a - b).abs().max())
        agree[str(batch)] = {"max_abs_diff": diff, "equal": diff == 0.0}
        if replays0 is not None:
            # the vendor arm must have replayed its graph, not run eager (a benchmark of eager steps is wrong)
            agree[str(batch)]["vendor_replays"] = vendor.stats.replays - replays0
            agree[str(batch)]["vendor_eager_steps"] = sum(vendor.stats.eager_steps.values()) - eager0
            if agree[str(batch)]["vendor_eager_steps"] or not agree[str(batch)]["vendor_replays"]:
                raise RuntimeError(f"vendor arm at batch {batch} did not replay: {dict(vendor.stats.eager_steps)}")
        stack.graph_of("lmdeploy", batch)  # raises unless lmdeploy's arm captured this batch
        log(f"warm b={batch}: hidden states vendor vs lmdeploy max abs diff {diff}; {agree[str(batch)]}")
    return agree


def profile_counts(stack: Stack, batches, steps: int, log, info: dict) -> dict:
    """Per arm, batch and kind: the profiler's counts per call (CUDA), or the simulator's device ops."""
    from torch.profiler import ProfilerActivity, profile, record_function

    sim_counts: dict[str, list[dict]] = {}
    if not stack.real:
        from vendor_graph_sim import device as sim
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if stack.real else [])
    with profile(activities=acts) as prof:
        for batch in batches:
            for arm in ARMS:
                stack.use(arm)
                for kind in KINDS:
                    label = f"{arm}/{batch}/{kind}"
                    for i in range(steps):
                        with stack.step_kwargs(batch) as kw:
                            if kind == "fill":  # the step's own dtype fix-up, which precedes the fill
                                stack.runners[arm]._prepare_inputs(**kw)
                            stack.sync()
                            counter = sim.count_ops() if not stack.real else contextlib.nullcontext()
                            with counter as c, record_function(f"vgk|{label}|{i}"):
                                _call(stack, arm, kind, batch, kw)
                            if c is not None:
                                sim_counts.setdefault(label, []).append(
                                    {k: getattr(c, k) for k in type(c).__slots__ if isinstance(getattr(c, k), int)})
                            stack.sync()
                            with record_function(f"vgkend|{label}|{i}"):  # the device is done with the region
                                pass
        stack.sync()
    trace = _export(prof)
    info["trace_categories"] = dict(Counter(e.get("cat", "?") for e in trace.get("traceEvents", [])
                                            if isinstance(e, dict)))
    per_label = count_trace(trace)
    out: dict = {}
    for batch in batches:
        for arm in ARMS:
            for kind in KINDS:
                label = f"{arm}/{batch}/{kind}"
                rec = summarise_counts(per_label.get(label, [])) if per_label.get(label) else None
                if label in sim_counts:
                    rec = rec or {}
                    rec["sim_device_ops"] = {k: statistics.median(d[k] for d in sim_counts[label])
                                             for k in sim_counts[label][0]}
                out.setdefault(str(batch), {}).setdefault(arm, {})[kind] = rec
                if rec and "kernels" in rec:
                    log(f"counts b={batch} {arm:8s} {kind:4s}: kernels {rec['kernels']['median']} memcpy "
                        f"{rec['memcpy']['median']} memset {rec['memset']['median']} graph kernels "
                        f"{rec['graph_kernels']['median']} api {rec['api_kinds']}")
    return out


def timing(stack: Stack, batches, rounds: int, per_round: int, log) -> dict:
    """Step and bare-replay device time per arm, arms alternating by round (order swapped every round),
    (step, bare) pairs interleaved within each; per-round medians and paired statistics."""
    out = {}
    for batch in batches:
        rec = {arm: {"step": [], "bare": [], "step_host": [], "diff": []} for arm in ARMS}
        for r in range(rounds):
            for arm in (ARMS if r % 2 == 0 else ARMS[::-1]):
                stack.use(arm)
                graph = stack.graph_of(arm, batch)._graph
                with stack.step_kwargs(batch) as kw:  # one untimed step after the switch
                    stack.runners[arm](**kw)
                steps, bares, hosts = [], [], []
                for i in range(per_round):
                    pair = ("step", "bare") if i % 2 == 0 else ("bare", "step")
                    for kind in pair:
                        if kind == "step":
                            with stack.step_kwargs(batch) as kw:
                                stack.sync()
                                t0 = time.perf_counter()
                                stack.runners[arm](**kw)
                                t1 = time.perf_counter()
                                stack.sync()
                                t2 = time.perf_counter()
                            steps.append(t2 - t0)
                            hosts.append(t1 - t0)
                        else:
                            stack.sync()
                            t0 = time.perf_counter()
                            graph.replay()
                            stack.sync()
                            bares.append(time.perf_counter() - t0)
                rec[arm]["step"].append(1e6 * statistics.median(steps))
                rec[arm]["bare"].append(1e6 * statistics.median(bares))
                rec[arm]["step_host"].append(1e6 * statistics.median(hosts))
                rec[arm]["diff"].append(1e6 * statistics.median([s - b for s, b in zip(steps, bares, strict=True)]))
        res = {arm: {"round_step_median_us": v["step"], "round_bare_median_us": v["bare"],
                     "round_step_host_median_us": v["step_host"],
                     "step_us": _stats.spread(v["step"]), "bare_us": _stats.spread(v["bare"]),
                     "step_minus_bare_us": _stats.paired(v["diff"])} for arm, v in rec.items()}
        res["vendor_minus_lmdeploy_step_us"] = _stats.paired(
            [a - b for a, b in zip(rec["vendor"]["step"], rec["lmdeploy"]["step"], strict=True)])
        res["vendor_over_lmdeploy_step"] = _stats.paired(
            [a / b for a, b in zip(rec["vendor"]["step"], rec["lmdeploy"]["step"], strict=True)])
        out[str(batch)] = res
        log(f"timing b={batch}: step-bare vendor {res['vendor']['step_minus_bare_us']['median']:.1f} us, lmdeploy "
            f"{res['lmdeploy']['step_minus_bare_us']['median']:.1f} us; vendor-lmdeploy step "
            f"{res['vendor_minus_lmdeploy_step_us']['median']:.1f} us")
    return out


def phases(stack: Stack, batches, steps: int) -> dict:
    out = {}
    for batch in batches:
        for arm in ARMS:
            stack.use(arm)
            with _phases.phase_timers(stack.runners[arm]) as clock:
                for _ in range(steps):
                    with stack.step_kwargs(batch) as kw:
                        stack.sync()
                        with clock.region("unattributed (runner __call__ bodies, timing)"):
                            stack.runners[arm](**kw)
                        stack.sync()
            out.setdefault(str(batch), {})[arm] = clock.summary()
    return out


def main_run(stack_factory, out_path: str, batches, profile_steps: int, rounds: int, per_round: int,
             phase_steps: int, meta: dict) -> int:
    result: dict = {"task": "kernel_counts", "batches": list(batches), "seed": SEED, "profile_steps": profile_steps,
                    "rounds": rounds, "per_round": per_round, **meta, "errors": {}}

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def save() -> None:
        with open(out_path, "w") as f:
            json.dump(result, f, indent=1)

    t0 = time.perf_counter()
    try:
        stack = stack_factory()
    except BaseException as exc:  # noqa: BLE001 - lmdeploy's checks call exit(1): keep the reason
        traceback.print_exc()
        result["errors"]["build"] = f"{type(exc).__name__}: {exc}"
        save()
        return 1
    result["build_s"] = stack.build_s
    result["runners"] = {arm: type(r).__qualname__ for arm, r in stack.runners.items()}
    result["pinned_methods"] = {n: f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', '?')}"
                                for n, f in stack.pins.items()}
    if hasattr(stack, "lmdeploy_originals"):  # the dry run checks the look-up the GPU run pins with
        result["lmdeploy_originals_found"] = {n: f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', '?')}"
                                              for n, f in stack.lmdeploy_originals.items()}
    import torch

    result.update(torch=torch.__version__, device=torch.cuda.get_device_name() if stack.real else "CPU simulator")
    try:
        from vendor_graph.upstream import compat

        result["lmdeploy"] = str(compat.installed_lmdeploy_version())
    except Exception:  # noqa: BLE001
        pass
    save()
    for name, fn in (("agreement", lambda: warm(stack, batches, log)),  # raises: nothing else is worth measuring
                     ("counts", lambda: profile_counts(stack, batches, profile_steps, log, result)),
                     ("timing", lambda: timing(stack, batches, rounds, per_round, log)),
                     ("phases", lambda: phases(stack, batches, phase_steps))):
        start = time.perf_counter()
        try:
            result[name] = fn()
        except Exception as exc:  # noqa: BLE001 - keep what the other measurements give
            traceback.print_exc()
            result["errors"][name] = f"{type(exc).__name__}: {exc}"
            if name == "agreement":
                save()
                break
        result.setdefault("seconds", {})[name] = time.perf_counter() - start
        save()
        log(f"{name} done in {time.perf_counter() - start:.1f} s")
    runner = stack.runners["vendor"]
    if hasattr(runner, "stats"):
        result["vendor_stats"] = runner.stats.summary()
        result["vendor_eager_reasons"] = {str(k): v for k, v in runner.eager_reasons().items()}
    result["wall_s"] = time.perf_counter() - t0
    save()
    stack.close()
    return 0 if not result["errors"] else 1


def cli(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("model_dir")
    r.add_argument("out")
    d = sub.add_parser("dry")
    d.add_argument("out")
    sub.add_parser("selftest")
    for q in (r, d):
        q.add_argument("--batches", type=int, nargs="+")
        q.add_argument("--profile-steps", type=int, default=PROFILE_STEPS)
        q.add_argument("--rounds", type=int)
        q.add_argument("--per-round", type=int)
        q.add_argument("--phase-steps", type=int)
    args = p.parse_args(argv)
    if args.cmd == "selftest":
        selftest()
        return 0
    if args.cmd == "run":
        batches = tuple(args.batches or BATCHES)
        rc = main_run(lambda: EngineStack(args.model_dir, batches), args.out, batches, args.profile_steps,
                      args.rounds or ROUNDS, args.per_round or PER_ROUND, args.phase_steps or PHASE_STEPS,
                      {"dry_run": False, "model_dir": args.model_dir})
        sys.stdout.flush()
        os._exit(rc)  # do not wait for the engine's threads
    batches = tuple(args.batches or (1, 8))
    return main_run(lambda: SimStack(batches), args.out, batches, min(args.profile_steps, 2), args.rounds or 2,
                    args.per_round or 3, args.phase_steps or 5, {"dry_run": True})


if __name__ == "__main__":  # lmdeploy's environment check spawns processes: everything under the guard
    sys.exit(cli())
