"""Per replayed decode step inside lmdeploy's own engine: vendor_graph's Ascend graph runner against dlinfer's
``AscendGraphRunner``, same engine, same workload, on the simulated NPU: device operations issued outside the
graph, host syncs and device-to-host copies, at every decode batch size the workload goes through.

Each arm is one child process (the simulated torch_npu and dlinfer patch their process) running
:func:`vendor_graph_sim.engine.run`: lmdeploy's real ``pipeline()`` (Ascend, graph mode, greedy, ``ignore_eos``)
over the tiny random-weight Llama of :func:`vendor_graph_sim.engine.write_model`, with ``VENDOR_GRAPH_SIM=<gen>``
in the child's environment. The vendor_graph child does ``import vendor_graph.ascend`` first, as a user does;
the dlinfer child does not, and lmdeploy builds dlinfer's own runner. The dlinfer child still gets vendor_graph's
bridges alone (:func:`vendor_graph_sim.engine.install_bridges_alone`; only ``state-cache`` installs on 0.16):
lmdeploy 0.16's ``StateCacheEngine`` calls dlinfer main's ``allocate_caches`` with keywords it does not take, and
the engine does not start without it. That bridge runs once, when the cache engine is built; it touches no step.

lmdeploy 0.16 only: it is the release whose builder still builds dlinfer's runner (0.17/0.18 pass ``is_mla=``,
which this dlinfer's runner does not take). Run under another lmdeploy, the script says which environment to use.

Counted per call of the graph runner (its ``__call__``, which lmdeploy's model agent makes once per step), on the
simulator's device counters (exact): the runner object the agent builds (``model_agent.patched_model``) is
wrapped as ``benchmarks/runner_vs_dlinfer.py`` wraps it (:func:`runner_vs_dlinfer._instrument`, also counting the
runner's ``prepare_inputs_for_generation`` apart), and the call's real batch is read from its inputs
(``attn_metadata.is_decoding`` and the number of ``input_ids`` of a decode step). A call is a **replayed decode
step** when it decodes, captures nothing and exactly one graph replay happened in it. ``device_ops``: every op
issued eagerly outside any graph (kernels, copies, factory fills, graph replays, task updates); ``syncs``: host
waits on device work; ``d2h``: device-to-host copies (a blocking one counts in both).

Workload (fixed): :func:`vendor_graph_sim.engine.workload` with seed 0 and 12 requests (prompts of 3 to 37
words, 8 + 3 i new tokens for request i: 8 to 41) through ``max_batch_size`` 8, so requests queue, join mid-run
as others finish, and the decode batch goes through every size from 8 down to 1. Each child serves it eager first
(a reference, not counted), then in graph mode. The graph tokens of the two arms of a generation must be equal, else
their comparison is marked meaningless; such a pair is run again (:data:`ATTEMPTS` in all), every attempt set aside
recorded.

GOAL (fixed before running; reported, not asserted): at every decode batch both runners replay, vendor_graph's
median device ops per replayed decode step at most half dlinfer's, and vendor_graph's host syncs and D2H copies
per replayed decode step zero (max over the steps), with both arms' tokens equal.

    VENDOR_GRAPH_DLINFER_SRC=/path/to/dlinfer OMP_NUM_THREADS=1 \
        .venvs/test-lmdeploy-0.16.0/bin/python benchmarks/engine_step_cost.py [--generations G5 G2b G1]
    VENDOR_GRAPH_SIM=G5 .venvs/test-lmdeploy-0.16.0/bin/python benchmarks/engine_step_cost.py \
        --child G5 dlinfer OUT.json                                                             # one arm
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
import runner_vs_dlinfer as rvd  # noqa: E402

NAME = "engine_step_cost"
MODEL = "lmdeploy-llama"
SEED = 0
REQUESTS = 12
MAX_BATCH_SIZE = 8
LMDEPLOY = "0.16"  # the release whose builder builds dlinfer's runner
# G5: both runners on the graph-update path (NPUGraph.update). G2b (torch_npu 2.8.0): dlinfer's runner on its own
# task-update path (its aclgraph_use_torch_npu_update() is false below 2.8.0.post1), vendor_graph's on
# graph-update. G1: vendor_graph's task-update path (no NPUGraph.update); dlinfer's runner passes graph()
# auto_dispatch_capture, which G1 lacks: recorded as it goes.
GENERATIONS = ("G5", "G2b", "G1")
RUNNERS = ("vendor_graph", "dlinfer")
GOAL_OPS_RATIO = 0.5
GOAL_SYNCS = 0
GOAL_D2H = 0
CHILD_TIMEOUT_S = 420
# Graph-mode runs of this engine on the simulator now and then decode differently from the eager tokens (either
# runner; the eager runs agree): a pair whose arms' tokens differ is run again, at most this many times in all, and
# every attempt set aside is recorded with which arm left its eager tokens.
ATTEMPTS = 3


# -- child: one (generation, runner) ---------------------------------------------------------------------------


def step_of(kwargs: dict[str, Any]) -> dict[str, Any]:
    """What one runner call is, from its inputs: decoding or not, and its real batch (sequences): the number of
    ``input_ids`` of a decode step (one token each), the length of ``kv_seqlens`` otherwise where present."""
    meta = kwargs.get("attn_metadata")
    ids = kwargs.get("input_ids")
    tokens = int(ids.shape[-1]) if ids is not None else -1
    decoding = bool(getattr(meta, "is_decoding", False))
    kv = getattr(meta, "kv_seqlens", None)
    seqs = tokens if decoding else (int(kv.shape[0]) if kv is not None and hasattr(kv, "shape") else -1)
    return {"decoding": decoding, "batch": seqs, "what": "decode" if decoding else "prefill"}


def _watch_op_sites(state: dict[str, Any]) -> None:
    """Record where each device operation of a runner call is issued (``op @ file:line (function)``, the innermost
    frame outside the simulator and torch): every tensor op through the simulated device tensor's dispatch and
    every factory. Graph replays and ``NPUGraph.update`` are issued by the graph objects themselves: not here."""
    from vendor_graph_sim.device import _runtime, _tensor

    depth = [0]

    def watch(fn: Any) -> Any:
        def watched(*args: Any, **kwargs: Any) -> Any:
            sites = state.get("op_sites")
            if sites is None or depth[0]:
                return fn(*args, **kwargs)
            before = Counter(_runtime.counters.by_op)
            depth[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
                grown = _runtime.counters.by_op - before
                if grown:
                    where = rvd._site()
                    for op, n in grown.items():
                        sites[f"{op} @ {where}"] += n
        return watched

    dispatch = _tensor.SimTensor.__dict__["__torch_dispatch__"].__func__
    _tensor.SimTensor.__torch_dispatch__ = classmethod(watch(dispatch))
    _tensor.adopt_factory = watch(_tensor.adopt_factory)


def _describe_steps(runner: Any, log: list[dict[str, Any]], state: dict[str, Any]) -> None:
    """Wrap ``runner`` (already counting) once more: before each call, put what the call is into ``state``, which
    :func:`runner_vs_dlinfer._instrument`'s counting reads; after it, add where its device ops came from."""
    cls = type(runner)

    def __call__(self: Any, **kwargs: Any) -> Any:
        state.update(step_of(kwargs))
        state["op_sites"] = Counter()
        try:
            return cls.__call__(self, **kwargs)
        finally:
            sites = state.pop("op_sites")
            if log:
                log[-1]["op_sites"] = dict(sites)

    runner.__class__ = type(cls.__name__, (cls,), {"__call__": __call__})


def _count_built_runners(log: list[dict[str, Any]], state: dict[str, Any], built: list[str]) -> None:
    """Make lmdeploy's model agent count every call of the graph runner it builds (``patched_model``)."""
    from lmdeploy.pytorch.engine.model_agent import agent

    original = agent.BaseModelAgent.build_graph_runner

    def build_graph_runner(self: Any) -> Any:
        out = original(self)
        if self.backend_config.eager_mode:
            return out  # the eager reference run: not counted
        runner = self.patched_model
        built.append(f"{type(runner).__module__}.{type(runner).__qualname__}")
        rvd._instrument(runner, log, state)
        _describe_steps(runner, log, state)
        return out

    agent.BaseModelAgent.build_graph_runner = build_graph_runner


def child(generation: str, which: str, out: Path, requests: int, max_batch_size: int, seed: int) -> int:
    t0 = time.perf_counter()
    result: dict[str, Any] = {"generation": generation, "runner": which, "model": MODEL, "seed": seed,
                              "requests": requests, "max_batch_size": max_batch_size}
    log: list[dict[str, Any]] = []
    state: dict[str, Any] = {}
    built: list[str] = []
    try:
        from vendor_graph_sim import boot, engine

        result["simulated"] = os.environ.get(boot.ENV)
        engine.switch_on(generation)
        if which == "vendor_graph":
            import vendor_graph.ascend  # noqa: F401  (what the user writes before lmdeploy starts)
            from vendor_graph.install import bridges

            def bridge_names() -> list[str]:
                return sorted({b.name for b in bridges.applied()})

            result["vendor_graph_source"] = rvd._vendor_graph_source()
        else:
            bridge_names = engine.install_bridges_alone()
        rvd._watch_syncs(state)
        _watch_op_sites(state)
        _count_built_runners(log, state, built)
        import lmdeploy

        result["lmdeploy"] = lmdeploy.__version__
        with tempfile.TemporaryDirectory(prefix="engine-step-cost-") as tmp:
            checkpoint = engine.write_model(MODEL, Path(tmp) / MODEL, seed)
            load = engine.workload(seed, requests=requests)
            result["max_new_tokens"] = [r.max_new_tokens for r in load]
            eager = engine.run(checkpoint, model=MODEL, graph=False, requests=load, max_batch_size=max_batch_size)
            result["eager_tokens"] = eager.tokens
            record = engine.run(checkpoint, model=MODEL, graph=True, requests=load, max_batch_size=max_batch_size)
        from vendor_graph_sim import realstack

        result.update(torch_npu=record.torch_npu, dlinfer=realstack.dlinfer_description(), bridges=bridge_names(),
                      tokens=record.tokens, equal_to_eager=record.tokens == eager.tokens,
                      finish_reasons=record.finish_reasons, eager_seconds=eager.seconds, engine_seconds=record.seconds,
                      captures=record.captures, replays=record.replays, eager_reasons=record.eager_reasons,
                      histogram=record.histogram)
    except Exception as exc:  # noqa: BLE001 - a runner or engine failing is a result
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["error_traceback"] = traceback.format_exc()[-6000:]
        if "torch_npu" in sys.modules:
            result["torch_npu"] = getattr(sys.modules["torch_npu"], "__version__", "?")
    result.update(runner_class=built[0] if built else None, runners_built=built, calls=log)
    result["child_s"] = round(time.perf_counter() - t0, 2)
    out.write_text(json.dumps(result, indent=1))
    return 0


# -- parent ----------------------------------------------------------------------------------------------------


def run_child(generation: str, which: str, workdir: Path, *, requests: int = REQUESTS,
              max_batch_size: int = MAX_BATCH_SIZE, seed: int = SEED, python: str | None = None) -> dict[str, Any]:
    """One arm in its own interpreter (``python``, default this one), ``VENDOR_GRAPH_SIM=generation``."""
    out = workdir / f"{generation}-{which}.json"
    env = rvd._child_env(which, None, None)
    env["VENDOR_GRAPH_SIM"] = generation
    base = {"generation": generation, "runner": which}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([python or sys.executable, __file__, "--child", generation, which, str(out),
                               "--requests", str(requests), "--max-batch-size", str(max_batch_size),
                               "--seed", str(seed)], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
                              env=env, cwd=workdir)
    except subprocess.TimeoutExpired:
        return {**base, "error": f"child timed out after {CHILD_TIMEOUT_S} s"}
    wall = round(time.perf_counter() - t0, 1)
    if proc.returncode != 0 or not out.is_file():
        return {**base, "error": f"child exited {proc.returncode}", "stderr_tail": proc.stderr[-4000:], "wall_s": wall}
    return {**base, **json.loads(out.read_text()), "wall_s": wall}


def replayed_decode(call: dict[str, Any]) -> bool:
    """A decode step that captured nothing and replayed exactly one graph."""
    return call["decoding"] and call["kind"] == "replay" and call["replays"] == 1 and not call["captured"]


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    """Per decode batch: the replayed decode steps' device ops, syncs and D2H copies, and what they issued."""
    calls = result.get("calls", [])
    decode = [c for c in calls if c["decoding"]]
    out: dict[str, Any] = {"calls": len(calls), "prefill_calls": len(calls) - len(decode),
                           "decode_calls": len(decode), "replayed_decode_steps": sum(map(replayed_decode, calls)),
                           "decode_kinds": dict(Counter(c["kind"] for c in decode)), "by_batch": {}}
    for batch in sorted({c["batch"] for c in decode}):
        at = [c for c in decode if c["batch"] == batch]
        steps = [c for c in at if replayed_decode(c)]
        row: dict[str, Any] = {"decode_calls": len(at), "steps": len(steps),
                               "other_kinds": dict(Counter(c["kind"] for c in at if not replayed_decode(c)))}
        if steps:
            for key in ("device_ops", "syncs", "d2h", "h2d", "graph_update_calls", "task_updates",
                        "prepare_device_ops", "prepare_syncs", "prepare_d2h"):
                row[key] = rvd._stats([c[key] for c in steps])
            for key, field in (("by_op_per_step", "by_op"), ("sync_sites_per_step", "sync_sites"),
                               ("op_sites_per_step", "op_sites")):
                total: Counter[str] = Counter()
                for c in steps:
                    total.update(c.get(field, {}))
                row[key] = {k: round(n / len(steps), 3) for k, n in sorted(total.items(), key=lambda kv: (-kv[1],
                                                                                                          kv[0]))}
        out["by_batch"][str(batch)] = row
    return out


def tokens_equal(vg: dict[str, Any], dl: dict[str, Any]) -> bool | None:
    """Whether both arms decoded the same tokens; None when an arm did not run to the end."""
    if "error" in vg or "error" in dl:
        return None
    return bool(vg.get("tokens")) and vg.get("tokens") == dl.get("tokens")


def goal(vg: dict[str, Any], dl: dict[str, Any], equal: bool | None) -> dict[str, dict[str, Any]]:
    """Per decode batch of either arm: the verdict (None where it cannot be judged, with why)."""
    verdicts: dict[str, dict[str, Any]] = {}
    for batch in sorted(set(vg["by_batch"]) | set(dl["by_batch"]), key=int):
        a, b = vg["by_batch"].get(batch, {}), dl["by_batch"].get(batch, {})
        if not a.get("steps") or not b.get("steps"):
            who = " and ".join(n for n, r in (("vendor_graph", a), ("dlinfer", b)) if not r.get("steps"))
            verdicts[batch] = {"met": None, "why": f"{who}: no replayed decode step at this batch"}
            continue
        if not equal:
            why = "an arm failed" if equal is None else "the two arms decoded different tokens: no comparison"
        ratio = a["device_ops"]["median"] / b["device_ops"]["median"] if b["device_ops"]["median"] else None
        v = {"ops_ratio": None if ratio is None else round(ratio, 3),
             "ops_ok": ratio is not None and ratio <= GOAL_OPS_RATIO,
             "syncs_ok": a["syncs"]["max"] <= GOAL_SYNCS, "d2h_ok": a["d2h"]["max"] <= GOAL_D2H}
        v["met"] = v["ops_ok"] and v["syncs_ok"] and v["d2h_ok"]
        if not equal:
            v.update(met=None, why=why)
        verdicts[batch] = v
    return verdicts


def _spread(stats: dict[str, Any]) -> str:
    if stats["min"] == stats["max"]:
        return f"{stats['median']:g}"
    return f"{stats['median']:g} ({stats['min']:g}-{stats['max']:g})"


def _mark(v: dict[str, Any]) -> str:
    if v["met"] is None:
        return f"n/a: {v['why']}"
    if v["met"]:
        return "met"
    return "NOT met (" + ", ".join(n for n, k in (("ops", "ops_ok"), ("syncs", "syncs_ok"), ("d2h", "d2h_ok"))
                                   if not v[k]) + ")"


def _outcome(r: dict[str, Any]) -> str:
    if "error" in r:
        text = f"**failed**: {r['error'][:300]}"
    else:
        text = f"{r.get('runner_class')}, {len(r.get('calls', []))} runner calls"
    return text.replace("|", "\\|").replace("\n", " ")


def _equal(equal: bool | None) -> str:
    return "-" if equal is None else "yes" if equal else "**NO**"


def tables(pairs: list[dict[str, Any]]) -> list[str]:
    w = pairs[0]["workload"] if pairs else {"seed": SEED, "requests": REQUESTS, "max_batch_size": MAX_BATCH_SIZE}
    lines = [
        "# Per replayed decode step in lmdeploy's engine: vendor_graph's Ascend runner vs dlinfer's", "",
        f"lmdeploy {LMDEPLOY}'s `pipeline()` on the simulated NPU (`vendor_graph_sim.engine`), `{MODEL}` (seed "
        f"{w['seed']}), {w['requests']} requests of different lengths through max_batch_size {w['max_batch_size']} "
        "(they queue, join "
        "mid-run and finish at different lengths), greedy. One child process per (generation, runner). Counted per "
        "runner `__call__` on the simulator's counters (exact); a replayed decode step is a decode call with exactly "
        "one graph replay and no capture; its batch is read from its inputs. ops = device operations issued outside "
        "the graph; syncs = host waits on device work; d2h = device-to-host copies. Per step: median, (min-max) "
        "where the steps differ.", "",
        f"GOAL, per decode batch: vendor_graph median ops per replayed decode step <= {GOAL_OPS_RATIO:g} x "
        f"dlinfer's, vendor_graph syncs = {GOAL_SYNCS} and d2h = {GOAL_D2H} in every replayed decode step, both "
        "arms' tokens equal. Reported, not asserted.", "",
        "vendor_graph source (path, digest of its .py files per child): " + ", ".join(sorted(
            {json.dumps(p["vendor_graph"]["vendor_graph_source"]) for p in pairs
             if p["vendor_graph"].get("vendor_graph_source")})), "",
        "## Arms", "",
        "| generation | attempt | runner | torch_npu | lmdeploy | outcome | prefill / decode calls | decode calls by "
        "kind | replayed decode steps | tokens | tokens equal between arms | graph tokens = its eager run | child s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in pairs:
        for which in RUNNERS:
            r, s = p[which], p["summary"][which]
            count = sum(map(len, r.get("tokens", [])))
            lines.append(f"| {p['generation']} | {p['attempt']} | {which} | {r.get('torch_npu', '-')} | "
                         f"{r.get('lmdeploy', '-')} | {_outcome(r)} | {s['prefill_calls']} / {s['decode_calls']} | "
                         f"{', '.join(f'{k} {n}' for k, n in sorted(s['decode_kinds'].items())) or '-'} | "
                         f"{s['replayed_decode_steps']} | {count} | {_equal(p['tokens_equal'])} | "
                         f"{_equal(r.get('equal_to_eager'))} | {r.get('child_s', r.get('wall_s', '-'))} |")
    discarded = [(p["generation"], a) for p in pairs for a in p["discarded_attempts"]]
    if discarded:
        lines += ["", "Attempts set aside (the arms' tokens differed; each arm's graph run against its own eager run, "
                  "and whether its per-batch median ops / syncs / d2h equal the kept attempt's):", ""]
        for generation, a in discarded:
            kept = next(p for p in pairs if p["generation"] == generation)
            parts = []
            for which in RUNNERS:
                x = a[which]
                where = f" (first difference {x['first_difference_from_eager']})" \
                    if x["equal_to_eager"] is False else ""
                same = x["per_batch"] == medians(kept["summary"][which])
                parts.append(f"{which} graph = eager: {_equal(x['equal_to_eager'])}{where}, counts as kept: "
                             f"{'yes' if same else 'NO'}")
            lines.append(f"- {generation} attempt {a['attempt']}: arms first differ at "
                         f"{a['first_difference_between_arms']}; " + "; ".join(parts))
    lines += ["", "## Per decode batch (replayed decode steps)", "",
              "| generation | batch | steps (vendor_graph / dlinfer) | vendor_graph ops / syncs / d2h per step "
              "| dlinfer ops / syncs / d2h per step | ops ratio | goal met |", "|---|---|---|---|---|---|---|"]
    for p in pairs:
        vg, dl = p["summary"]["vendor_graph"]["by_batch"], p["summary"]["dlinfer"]["by_batch"]
        for batch, v in p["goal"].items():
            cells = []
            for row in (vg.get(batch, {}), dl.get(batch, {})):
                cells.append(" / ".join(_spread(row[k]) for k in ("device_ops", "syncs", "d2h"))
                             if row.get("steps") else "-")
            steps = f"{vg.get(batch, {}).get('steps', 0)} / {dl.get(batch, {}).get('steps', 0)}"
            lines.append(f"| {p['generation']} | {batch} | {steps} | {cells[0]} | {cells[1]} | "
                         f"{v.get('ops_ratio', '-')} | {_mark(v)} |")
    lines += ["", "## What each runner issues outside the graph per replayed decode step (by op, mean over the "
              "steps of each batch; batches with the same breakdown merged)", "",
              "`NPUGraph.update` is the host call: listed, not counted as a device op; what it issues is counted "
              "(the re-issued attention tasks `task_update:*` and their `graph.task_update`). `graph.replay` is the "
              "replay.", ""]
    for p in pairs:
        for which in RUNNERS:
            groups: dict[str, list[str]] = {}
            for batch, row in p["summary"][which]["by_batch"].items():
                if row.get("steps"):
                    key = ", ".join(f"`{op}` {n:g}" for op, n in sorted(row["by_op_per_step"].items(),
                                                                       key=lambda kv: (-kv[1], kv[0])))
                    groups.setdefault(key, []).append(batch)
            for key, batches in groups.items():
                lines.append(f"- {p['generation']} {which}, batch {', '.join(batches)}: {key}")
    lines += ["", "## Where those ops are issued (per replayed decode step, mean over all of them; graph replays "
              "and `NPUGraph.update` calls are issued by the graph object and not attributed)", ""]
    for p in pairs:
        for which in RUNNERS:
            steps, sites = _sites(p, which, "op_sites_per_step")
            if steps:
                lines.append(f"- {p['generation']} {which}: " + "; ".join(
                    f"`{k}` {n / steps:.2f}" for k, n in sorted(sites.items(), key=lambda kv: (-kv[1], kv[0]))))
    lines += ["", "## Host syncs of replayed decode steps, by call site (per step)", ""]
    for p in pairs:
        for which in RUNNERS:
            steps, sites = _sites(p, which, "sync_sites_per_step")
            body = ", ".join(f"`{k}` {n / steps:.2f}" for k, n in sites.most_common()) if steps and sites else "none"
            lines.append(f"- {p['generation']} {which}: {body}")
    lines += ["", "## The runner's `prepare_inputs_for_generation` (counted apart, per replayed decode step; "
              "median ops / syncs / d2h)", ""]
    for p in pairs:
        for which in RUNNERS:
            rows = [(b, r) for b, r in p["summary"][which]["by_batch"].items() if r.get("steps")]
            if rows:
                body = ", ".join(f"batch {b}: {r['prepare_device_ops']['median']:g} / {r['prepare_syncs']['median']:g}"
                                 f" / {r['prepare_d2h']['median']:g}" for b, r in rows)
                lines.append(f"- {p['generation']} {which}: {body}")
    return lines


def measure(generations: list[str], *, requests: int = REQUESTS, max_batch_size: int = MAX_BATCH_SIZE,
            seed: int = SEED, python: str | None = None, attempts: int = ATTEMPTS) -> list[dict[str, Any]]:
    """Both arms of each generation, one child at a time; each pair summarised and judged. A pair whose arms
    decoded different tokens is run again, up to ``attempts`` times in all; the attempts set aside are kept."""
    pairs = []
    workload = {"model": MODEL, "seed": seed, "requests": requests, "max_batch_size": max_batch_size}
    with tempfile.TemporaryDirectory(prefix="engine-step-cost-") as tmp:
        for generation in generations:
            discarded: list[dict[str, Any]] = []
            for attempt in range(1, attempts + 1):
                arms = {}
                for which in RUNNERS:
                    r = run_child(generation, which, Path(tmp), requests=requests, max_batch_size=max_batch_size,
                                  seed=seed, python=python)
                    print(f"{generation} {which} (attempt {attempt}): "
                          f"{'error: ' + r['error'][:200] if 'error' in r else 'ok'}, graph tokens equal to eager: "
                          f"{r.get('equal_to_eager', '-')} ({r.get('wall_s')} s)", file=sys.stderr, flush=True)
                    arms[which] = r
                summary = {w: summarise(arms[w]) for w in RUNNERS}
                equal = tokens_equal(arms["vendor_graph"], arms["dlinfer"])
                if equal is False and attempt < attempts:
                    discarded.append(_attempt_record(attempt, arms, summary))
                    continue
                break
            pairs.append({"generation": generation, "workload": workload, "attempt": attempt,
                          "discarded_attempts": discarded, **arms, "summary": summary, "tokens_equal": equal,
                          "goal": goal(summary["vendor_graph"], summary["dlinfer"], equal)})
    return pairs


def _attempt_record(attempt: int, arms: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    """What a discarded attempt (the arms' tokens differed) did: each arm against its own eager run, its first
    divergence, and its per-batch counts (to compare with the kept attempt's)."""
    out: dict[str, Any] = {"attempt": attempt}
    for which in RUNNERS:
        r = arms[which]
        out[which] = {"equal_to_eager": r.get("equal_to_eager"), "first_difference_from_eager":
                      first_difference(r.get("eager_tokens", []), r.get("tokens", [])),
                      "per_batch": medians(summary[which])}
    out["first_difference_between_arms"] = first_difference(arms["vendor_graph"].get("tokens", []),
                                                            arms["dlinfer"].get("tokens", []))
    return out


def medians(arm: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per decode batch with replayed decode steps: the median ops, syncs and d2h per step."""
    return {b: {k: row[k]["median"] for k in ("device_ops", "syncs", "d2h")}
            for b, row in arm["by_batch"].items() if row.get("steps")}


def first_difference(a: list[list[int]], b: list[list[int]]) -> str | None:
    """Where two runs' tokens first differ (``request i, token j``), or None."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            j = next((k for k, (u, v) in enumerate(zip(x, y, strict=False)) if u != v), min(len(x), len(y)))
            return f"request {i}, token {j}"
    return None if len(a) == len(b) else f"{len(a)} vs {len(b)} responses"


def parent(args: argparse.Namespace) -> int:
    problem = _common.dlinfer_problem()
    if problem is not None:
        print(f"{NAME}: {problem}", file=sys.stderr)
        return 2
    import lmdeploy

    if not lmdeploy.__version__.startswith(LMDEPLOY + "."):
        print(f"{NAME}: lmdeploy {lmdeploy.__version__} here; dlinfer's runner builds only on lmdeploy {LMDEPLOY}: "
              f"run it with .venvs/test-lmdeploy-0.16.0/bin/python (scripts/setup-test-env.sh 0.16.0)",
              file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    pairs = measure(args.generations)
    total = round(time.perf_counter() - t0, 1)
    payload = {"benchmark": NAME, "what": "device ops outside the graph, host syncs and D2H copies per replayed "
               "decode step inside lmdeploy's engine: vendor_graph's Ascend runner vs dlinfer's AscendGraphRunner, "
               "simulated NPU (exact counts)",
               "goal": {"ops_ratio_max": GOAL_OPS_RATIO, "syncs_max": GOAL_SYNCS, "d2h_max": GOAL_D2H,
                        "rule": "per decode batch both replay: vendor_graph median device ops per replayed decode "
                                "step <= ratio x dlinfer's; vendor_graph max syncs and max d2h per replayed decode "
                                "step <= their max; both arms' tokens equal"},
               "generations": args.generations, "environment": _common.environment(), "total_s": total,
               "pairs": [_recorded(pair) for pair in pairs]}
    table = tables(pairs) + ["", f"Total wall time {total} s (one child at a time, OMP_NUM_THREADS="
                                 f"{os.environ.get('OMP_NUM_THREADS', '1')})."]
    json_path, md_path = _common.write_results(NAME, payload, table)
    print("\n".join(table))
    print(f"wrote {json_path} and {md_path}")
    return 0


def _sites(pair: dict[str, Any], which: str, field: str) -> tuple[int, Counter[str]]:
    """One arm's replayed decode steps and, summed over them, the call sites of ``field`` (ops or syncs)."""
    sites: Counter[str] = Counter()
    steps = 0
    for row in pair["summary"][which]["by_batch"].values():
        steps += row["steps"]
        for k, n in row.get(field, {}).items():
            sites[k] += n * row["steps"]
    return steps, sites


def _recorded(pair: dict[str, Any]) -> dict[str, Any]:
    """What the results file keeps of a pair: the summaries and verdicts; of each arm, counts in place of its
    per-call records and token lists (the markdown has the per-batch figures)."""
    out = dict(pair)
    for which in RUNNERS:
        arm = dict(pair[which])
        arm["calls"] = len(arm.get("calls", []))
        for key in ("tokens", "eager_tokens"):
            if key in arm:
                arm[key] = sum(len(t) for t in arm[key])
        out[which] = arm
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=3, metavar=("GENERATION", "RUNNER", "OUT"))
    parser.add_argument("--generations", nargs="+", default=list(GENERATIONS))
    parser.add_argument("--requests", type=int, default=REQUESTS, help=argparse.SUPPRESS)  # children only
    parser.add_argument("--max-batch-size", type=int, default=MAX_BATCH_SIZE, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=SEED, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        generation, which, out = args.child
        if which not in RUNNERS:
            parser.error(f"RUNNER must be one of {RUNNERS}")
        return child(generation, which, Path(out).resolve(), args.requests, args.max_batch_size, args.seed)
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
