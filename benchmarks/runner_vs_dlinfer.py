"""vendor_graph's Ascend graph runner against dlinfer's own, on lmdeploy's tiny Llama over the real dlinfer on
the simulated NPU: device operations issued outside the graph, host syncs and seq-len update calls per replay
step, per live batch, and greedy-token parity of each against lmdeploy eager.

Both runners serve the same lmdeploy model (``realstack``'s tiny Llama, built by lmdeploy), the same seeded
decode schedule (live batch cycling through :data:`SIZES`, sequences joining and the oldest finishing as
``realstack.plan`` does) and the same step path (``realstack.forward``, where lmdeploy's ``model_forward``
calls the runner). dlinfer's runner is
``dlinfer.framework.lmdeploy_ext.cudagraph.ascend_cudagraph.AscendGraphRunner``, what real dlinfer serves when
vendor_graph is not active; vendor_graph's is what ``AscendOpsBackend.build_graph_runner`` returns with
``vendor_graph.ascend`` active. Each (generation, runner) runs in its own process (the simulated torch_npu is
per process and vendor_graph's activation patches lmdeploy process-wide):

    VENDOR_GRAPH_DLINFER_SRC=/path/to/dlinfer OMP_NUM_THREADS=1 .venv/bin/python benchmarks/runner_vs_dlinfer.py \
        [--generations G5 G3b G2b G1] [--lmdeploy installed .h200/pkgs017] [--vendor-graph-src DIR] [--jobs 2]
    .venv/bin/python benchmarks/runner_vs_dlinfer.py --child G1 dlinfer OUT.json    # one arm, JSON to OUT

Each generation runs on every lmdeploy given (default: the installed one, plus lmdeploy 0.17 from
``.h200/pkgs017`` where present): lmdeploy 0.18's Ascend attention reads host seq-len tensors
(``kv_seqlens_cpu``, ``cu_seqlens_q_cpu``) that dlinfer's buffer methods do not replace, 0.17's does not.

Counted per runner call, on the simulator's device counters (exact): ``device_ops`` (every op issued to a
stream outside a graph: kernels, copies, fills, replays, task updates; by op name too), ``syncs`` (host
waits on device work: synchronize, event synchronize, blocking host reads), ``d2h`` (device-to-host
copies), ``host_syncs = syncs + d2h``, ``NPUGraph.update`` calls and task updates (``graph.task_update``).
A replay step is a runner call that replays a graph and captures nothing. The runner's
``prepare_inputs_for_generation`` is counted apart (``prepare_*``); lmdeploy's context build
(``update_step_context``, the same for both) is not counted.

GOAL (fixed before running; reported, not asserted): at every live batch both replay, vendor_graph's median
device ops per replay step is at most half dlinfer's, and vendor_graph's max host syncs per replay step is 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402

NAME = "runner_vs_dlinfer"
MODEL = "lmdeploy-llama"
SEED = 0
# The live batch of each decode step (joins before it, the oldest finish when it shrinks): grows, shrinks,
# crosses dlinfer's capture sizes (1, 2, 4, 8, 16) both ways and returns to captured buckets.
SIZES = (1, 3, 8, 5, 16, 2, 12, 7, 16, 4, 9, 1, 6, 16, 3, 10)
STEPS = len(SIZES)
MAX_SEQS = 16
# G5 and G3b: graph.update generations (dlinfer: torch_npu >= 2.8.0.post1); G1: task-update only (dlinfer's
# graph() call passes auto_dispatch_capture, which G1 lacks); G2b (torch_npu 2.8.0): where dlinfer's own
# task-update path runs.
GENERATIONS = ("G5", "G3b", "G2b", "G1")
RUNNERS = ("dlinfer", "vendor_graph")
GOAL_OPS_RATIO = 0.5
GOAL_HOST_SYNCS = 0
CHILD_TIMEOUT_S = 420


# -- child: one (generation, runner) -----------------------------------------------------------------------

_SKIP_FRAMES = ("/vendor_graph_sim/device/", "/torch/", "/contextlib.py", "runner_vs_dlinfer.py")
_PACKAGES = ("dlinfer/", "lmdeploy/", "vendor_graph/", "vendor_graph_sim/")


def _site() -> str:
    """Where the host sync was asked for: the innermost frame outside the simulator, torch and this script."""
    import traceback as tb

    for frame in reversed(tb.extract_stack()[:-2]):
        name = frame.filename.replace("\\", "/")
        if name.startswith("<") or any(part in name for part in _SKIP_FRAMES):
            continue
        cut = max((name.rfind(p) for p in _PACKAGES), default=-1)
        return f"{name[cut:] if cut >= 0 else Path(name).name}:{frame.lineno} ({frame.name})"
    return "?"


def _watch_syncs(state: dict[str, Any]) -> None:
    """Record the call site of every host sync (the simulator's four sync entry points), per runner call."""
    from vendor_graph_sim.device import _runtime as rt

    def wrap(fn: Any) -> Any:
        def synced(*args: Any, **kwargs: Any) -> Any:
            sites = state.get("sites")
            if sites is not None:
                sites[_site()] += 1
            return fn(*args, **kwargs)
        return synced

    for name in ("sync_stream", "sync_device", "sync_current"):
        setattr(rt, name, wrap(getattr(rt, name)))
    rt.Event.synchronize = wrap(rt.Event.synchronize)


def _counts(c: Any) -> dict[str, Any]:
    by_op = dict(c.by_op)
    return {"device_ops": c.device_ops, "syncs": c.syncs, "d2h": c.d2h, "host_syncs": c.syncs + c.d2h,
            "h2d": c.h2d, "events": c.events, "replays": c.replays, "captured": c.captured,
            "graph_update_calls": by_op.get("NPUGraph.update", 0), "task_updates": by_op.get("graph.task_update", 0),
            "by_op": by_op}


def _instrument(runner: Any, log: list[dict[str, Any]], state: dict[str, Any]) -> None:
    """Count the device work of each call of ``runner`` (and of its ``prepare_inputs_for_generation``)
    by swapping in a subclass, so the runner's own code runs unchanged."""
    from vendor_graph_sim import device as sim

    cls = type(runner)
    call, prepare = cls.__call__, cls.prepare_inputs_for_generation

    def counted_prepare(self: Any, *args: Any, **kwargs: Any) -> Any:
        with sim.count_ops() as c:
            out = prepare(self, *args, **kwargs)
        state["prepare"] = _counts(c)
        return out

    def counted_call(self: Any, **kwargs: Any) -> Any:
        state["sites"] = Counter()
        failed = True
        t0 = time.perf_counter()
        try:
            with sim.count_ops() as c:
                out = call(self, **kwargs)
            failed = False
        finally:
            host_s = time.perf_counter() - t0
            sites = dict(state.pop("sites"))
            counts = _counts(c)
            kind = "failed" if failed else "capture" if c.captured else "replay" if c.replays else "eager"
            prep = state.pop("prepare", None) or {}
            log.append({"call": len(log), "what": state.get("what"), "decoding": state.get("decoding"),
                        "batch": state.get("batch"), "tokens": int(kwargs["input_ids"].shape[-1]),
                        "kind": kind, **counts, "sync_sites": sites, "host_s": round(host_s, 6),
                        **{f"prepare_{k}": prep.get(k, 0) for k in ("device_ops", "syncs", "d2h")}})
        return out

    runner.__class__ = type(f"Counting{cls.__name__}", (cls,), {
        "__call__": counted_call, "prepare_inputs_for_generation": counted_prepare})


def _graph_keys(runner: Any, which: str) -> list[str]:
    if which == "dlinfer":
        return sorted(str(k) for k in getattr(runner, "_runner_map", {}))
    graphs = getattr(runner, "graphs", None)
    return sorted(str(k) for k in graphs()) if graphs is not None else []


def _vendor_graph_source() -> dict[str, Any]:
    """Which vendor_graph the child imported, with a digest of its sources (the tree may be mid-edit)."""
    import hashlib

    import vendor_graph

    root = Path(vendor_graph.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return {"path": str(root), "sha256": digest.hexdigest()[:16]}


def child(generation: str, which: str, out: Path, steps: int, seed: int) -> int:
    import torch

    logging.getLogger("lmdeploy").setLevel(logging.ERROR)
    logging.getLogger("dlinfer").setLevel(logging.ERROR)
    t_start = time.perf_counter()
    result: dict[str, Any] = {"generation": generation, "runner": which, "model": MODEL, "seed": seed,
                              "steps": steps, "vendor_graph_source": _vendor_graph_source()}
    from vendor_graph_sim import device as sim
    from vendor_graph_sim import realstack

    import vendor_graph
    from vendor_graph import vendors

    sim.install()
    release = realstack.pinned_release(generation)
    result["torch_npu"] = release
    label = f"{sim.resolve(release)[1]} ({release})"
    import lmdeploy

    result["lmdeploy"] = lmdeploy.__version__
    with sim.use_torch_npu(release):
        try:
            realstack.import_dlinfer()
        except (AttributeError, ImportError) as exc:
            where = traceback.extract_tb(exc.__traceback__)[-1]
            result["dlinfer_import_error"] = (f"{type(exc).__name__}: {exc} ({Path(where.filename).name}:"
                                              f"{where.lineno})")
            result["error"] = "dlinfer does not import"
            out.write_text(json.dumps(result, indent=1))
            return 0
        result["dlinfer"] = realstack.dlinfer_description()
        vendor_graph.uninstall()
        if which == "vendor_graph":
            vendors.activate("ascend")
        from dlinfer.framework.lmdeploy_ext.cudagraph import ascend_cudagraph

        result["dlinfer_uses_graph_update"] = bool(ascend_cudagraph.aclgraph_use_torch_npu_update())
        log: list[dict[str, Any]] = []
        state: dict[str, Any] = {}
        build_notes: list[str] = []
        _watch_syncs(state)

        def factory(eager: bool) -> Any:
            if which == "vendor_graph":
                return built.runner(eager=eager)
            runner, note = realstack.dlinfer_graph_runner(built, eager)
            if note is not None and note not in build_notes:
                build_notes.append(note)
            return runner

        class Counting(realstack.Conformance):
            def _both(self, eager_seqs, graph_seqs, decoding, what, generate=True):  # noqa: ANN001
                state.update(what=what, decoding=decoding, batch=len(graph_seqs))
                return super()._both(eager_seqs, graph_seqs, decoding, what, generate)

        with realstack.ascend_context(), tempfile.TemporaryDirectory() as tmp:
            stream = torch.npu.Stream()
            with torch.npu.stream(stream):  # lmdeploy's agent runs its forward on a side stream
                built = realstack.build(MODEL, Path(tmp), max_batches=MAX_SEQS, seed=seed)
                conf = Counting(built, label, seed=seed, runner_factory=factory)
                runner = conf.graph.runner
                result["runner_class"] = f"{type(runner).__module__}.{type(runner).__qualname__}"
                _instrument(runner, log, state)
                t_run = time.perf_counter()
                try:
                    conf.run(steps, MAX_SEQS, sizes=SIZES)
                except Exception as exc:  # a runner failing (capture, replay) is a result
                    result["error"] = f"{type(exc).__name__}: {exc}"
                    result["error_at"] = state.get("what")
                    result["error_traceback"] = traceback.format_exc()[-6000:]
                result["run_s"] = round(time.perf_counter() - t_run, 2)
                record = conf.record
                result["graph_keys"] = _graph_keys(runner, which)
                stats = getattr(runner, "stats", None)
                if stats is not None:
                    result["vendor_graph_eager_reasons"] = dict(stats.eager_steps)
                graphs = getattr(runner, "graphs", None)
                if graphs is not None:
                    result["seqlen_paths"] = sorted({p for g in graphs().values() for p in g.paths})
        result["build_notes"] = build_notes
        result["prefill"] = record.prefill
        result["tokens"] = record.tokens
        result["steps_done"] = record.steps
        result["mismatches"] = record.mismatches
        result["greedy_mismatches"] = [m for m in record.mismatches if "greedy tokens" in m]
        result["greedy_parity"] = not result["greedy_mismatches"] and "error" not in result
        result["full_parity"] = not record.mismatches and "error" not in result
        result["calls"] = log
    result["child_s"] = round(time.perf_counter() - t_start, 2)
    out.write_text(json.dumps(result, indent=1))
    return 0


# -- parent ------------------------------------------------------------------------------------------------


def _child_env(which: str, lmdeploy_path: str | None, vendor_graph_src: str | None) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    if which == "dlinfer":  # nothing may activate vendor_graph in dlinfer's process
        env.pop("VENDOR_GRAPH_VENDOR", None)
        env["VENDOR_GRAPH_DISABLE_AUTOLOAD"] = "1"
    front = [p for p in (lmdeploy_path, vendor_graph_src) if p]
    if front:
        env["PYTHONPATH"] = os.pathsep.join([*front, *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_child(lmdeploy_path: str | None, generation: str, which: str, workdir: Path, steps: int, seed: int,
              vendor_graph_src: str | None) -> dict[str, Any]:
    tag = "installed" if lmdeploy_path is None else Path(lmdeploy_path).name
    out = workdir / f"{tag}-{generation}-{which}.json"
    t0 = time.perf_counter()
    base = {"generation": generation, "runner": which, "lmdeploy_path": lmdeploy_path}
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", generation, which, str(out), "--steps",
                               str(steps), "--seed", str(seed)], capture_output=True, text=True,
                              timeout=CHILD_TIMEOUT_S, env=_child_env(which, lmdeploy_path, vendor_graph_src))
    except subprocess.TimeoutExpired:
        return {**base, "error": f"child timed out after {CHILD_TIMEOUT_S} s",
                "wall_s": round(time.perf_counter() - t0, 1)}
    wall = round(time.perf_counter() - t0, 1)
    if proc.returncode != 0 or not out.is_file():
        return {**base, "error": f"child exited {proc.returncode}", "stderr_tail": proc.stderr[-4000:],
                "wall_s": wall}
    return {**base, **json.loads(out.read_text()), "wall_s": wall}


def _stats(values: list[float]) -> dict[str, Any]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def replay_steps(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in result.get("calls", []) if c["kind"] == "replay"]


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    """Per live batch: the replay steps' device ops, host syncs and update calls."""
    calls = result.get("calls", [])
    kinds = Counter(c["kind"] for c in calls)
    out: dict[str, Any] = {"calls": len(calls), "replay_steps": kinds["replay"], "capture_steps": kinds["capture"],
                           "eager_steps": kinds["eager"], "failed_calls": kinds["failed"],
                           "prefill_calls": sum(not c["decoding"] for c in calls), "by_batch": {}}
    replays = replay_steps(result)
    if replays:
        out["host_s_per_replay"] = _stats([c["host_s"] for c in replays])
        sites: Counter[str] = Counter()
        for c in replays:
            sites.update(c["sync_sites"])
        out["sync_sites_per_replay"] = {k: round(n / len(replays), 3) for k, n in sites.most_common()}
    decode = [c for c in calls if c["decoding"]]  # the live batch: sequences in a decode step
    for batch in sorted({c["batch"] for c in decode}):
        at = [c for c in decode if c["batch"] == batch]
        rs = [c for c in at if c["kind"] == "replay"]
        row: dict[str, Any] = {"calls": len(at), "replay_steps": len(rs)}
        row.update({f"{k}_steps": sum(c["kind"] == k for c in at) for k in ("capture", "eager", "failed")})
        if rs:
            for key in ("device_ops", "host_syncs", "syncs", "d2h", "h2d", "graph_update_calls", "task_updates",
                        "prepare_device_ops"):
                row[key] = _stats([c[key] for c in rs])
            ops: Counter[str] = Counter()
            for c in rs:
                ops.update(c["by_op"])
            row["by_op_per_replay"] = {op: round(n / len(rs), 2) for op, n in sorted(ops.items())}
        out["by_batch"][str(batch)] = row
    return out


def goal(dl: dict[str, Any], vg: dict[str, Any]) -> dict[str, Any]:
    """Per live batch: vendor_graph's median device ops <= half dlinfer's, and its max host syncs == 0."""
    verdicts = {}
    for batch in sorted(set(dl["by_batch"]) | set(vg["by_batch"]), key=int):
        a, b = dl["by_batch"].get(batch, {}), vg["by_batch"].get(batch, {})
        if not b.get("replay_steps"):
            verdicts[batch] = {"met": None, "why": "vendor_graph did not replay at this batch"}
            continue
        syncs_ok = b["host_syncs"]["max"] <= GOAL_HOST_SYNCS
        if not a.get("replay_steps"):
            verdicts[batch] = {"met": None, "syncs_ok": syncs_ok,
                               "why": "dlinfer did not replay at this batch: no ops comparison"}
            continue
        ratio = b["device_ops"]["median"] / a["device_ops"]["median"] if a["device_ops"]["median"] else None
        ops_ok = ratio is not None and ratio <= GOAL_OPS_RATIO
        verdicts[batch] = {"met": ops_ok and syncs_ok, "ops_ratio": None if ratio is None else round(ratio, 3),
                           "ops_ok": ops_ok, "syncs_ok": syncs_ok}
    return verdicts


def _outcome(r: dict[str, Any]) -> str:
    if "dlinfer_import_error" in r:
        text = f"dlinfer does not import: {r['dlinfer_import_error']}"
    elif "error" in r:
        text = f"**failed** at {r.get('error_at') or '?'}: {r['error'][:240]}"
    else:
        text = "ran the schedule"
    if r.get("build_notes"):
        text += f"; built directly ({'; '.join(r['build_notes'])[:200]})"
    return text.replace("|", "\\|").replace("\n", " ")


def _parity(r: dict[str, Any], greedy: bool) -> str:
    """Greedy tokens (or everything realstack compares: hidden states, tokens, KV cache) against eager."""
    if "calls" not in r:
        return "-"
    bad = r["greedy_mismatches"] if greedy else r["mismatches"]
    steps = len({m.split(":")[0] for m in bad})
    if bad:
        return f"NO ({steps} step{'s' * (steps != 1)})"
    until = " until the failure" if "error" in r else ""
    tokens = f"{r['tokens']} token{'s' * (r['tokens'] != 1)}"
    return f"yes{until} ({tokens})" if greedy else f"yes{until}"


def tables(arms: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    vg_sources = sorted({json.dumps(a["result"].get("vendor_graph_source")) for a in arms
                         if a["result"].get("vendor_graph_source")})
    lines = ["# vendor_graph's Ascend runner vs dlinfer's, real stack on the simulated NPU", "",
             f"lmdeploy's tiny Llama (`{MODEL}`) built by lmdeploy over the real dlinfer; seed {SEED}; live batches "
             f"{list(SIZES)} (max {MAX_SEQS}; prompts join before their step, the oldest sequences finish), "
             f"`realstack` conformance: graph runner side by side with lmdeploy eager. Counted per replay step "
             f"(a runner call that replays a graph and captures nothing), outside the graph, on the simulator's "
             f"device counters. host syncs = syncs + d2h (a blocking device-to-host read counts once in each).", "",
             f"GOAL, per live batch: vendor_graph median device ops per replay step <= {GOAL_OPS_RATIO:g} x dlinfer's, "
             f"and vendor_graph max host syncs per replay step == {GOAL_HOST_SYNCS}. Reported, not asserted.", "",
             f"vendor_graph source (path, digest of its .py files per child): {', '.join(vg_sources)}", "",
             "Outcome \"built directly\": lmdeploy's `AscendOpsBackend.build_graph_runner` raised, so dlinfer's runner "
             "was built with the builder's other arguments and side effects (`realstack.dlinfer_graph_runner`). "
             "Parity: greedy tokens of each decode step (prompt tokens fed by decode generate none) and, in \"full\", "
             "hidden states and KV cache too, against lmdeploy eager in the same process. \"sim host ms\" is CPU "
             "time of the simulator (it runs the replayed kernels on the host): noisy, not a device-time proxy.", "",
             "## Arms", "",
             "| lmdeploy | generation | torch_npu | runner | seq-len path | replay / capture / eager / failed calls "
             "| graphs | greedy parity | full parity | outcome | sim host ms / replay (median) | child s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for a in arms:
        r, s = a["result"], a["summary"]
        if a["runner"] == "dlinfer":
            path = ("graph.update" if r["dlinfer_uses_graph_update"] else "task-update") \
                if "dlinfer_uses_graph_update" in r else "-"
        else:
            path = ", ".join(r.get("seqlen_paths", [])) or "-"
        host = s.get("host_s_per_replay")
        host_ms = "-" if host is None else f"{host['median'] * 1e3:.1f}"
        lines.append(
            f"| {r.get('lmdeploy', '-')} | {a['generation']} | {r.get('torch_npu', '-')} | {a['runner']} | {path} | "
            f"{s['replay_steps']} / {s['capture_steps']} / {s['eager_steps']} / {s['failed_calls']} | "
            f"{len(r.get('graph_keys', []))} | "
            f"{_parity(r, True)} | {_parity(r, False)} | {_outcome(r)} | "
            f"{host_ms} | {r.get('child_s', r.get('wall_s', '-'))} |")
    lines += ["", "## Per live batch (replay steps)", "",
              "| lmdeploy | generation | batch | dlinfer replays | dlinfer ops median / max | dlinfer host syncs max "
              "(syncs, d2h) | dlinfer update / task-update calls max | vendor_graph replays | vendor_graph ops "
              "median / max | vendor_graph host syncs max (syncs, d2h) | vendor_graph update / task-update calls max "
              "| ops ratio | GOAL |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def cells(row: dict[str, Any] | None) -> list[str]:
        if not row or not row.get("replay_steps"):
            what = "never at this batch" if not row else ", ".join(
                f"{row[k + '_steps']} {k}" for k in ("capture", "eager", "failed") if row[k + "_steps"]) or "none"
            return [f"0 ({what})", "-", "-", "-"]
        return [str(row["replay_steps"]), f"{row['device_ops']['median']:g} / {row['device_ops']['max']}",
                f"{row['host_syncs']['max']} ({row['syncs']['max']}, {row['d2h']['max']})",
                f"{row['graph_update_calls']['max']} / {row['task_updates']['max']}"]

    for key, verdicts in goals_by_pair(arms).items():
        lm, gen = key
        dl = pair(arms, lm, gen, "dlinfer")["summary"]
        vg = pair(arms, lm, gen, "vendor_graph")["summary"]
        for batch, verdict in verdicts.items():
            met = verdict.get("met")
            if met is None:
                mark = f"n/a: {verdict['why']}" + ("" if verdict.get("syncs_ok", True) else
                                                   "; vendor_graph host syncs > 0")
            elif met:
                mark = "met"
            else:
                mark = "NOT met (" + ", ".join(n for n, k in (("ops", "ops_ok"), ("host syncs", "syncs_ok"))
                                               if not verdict[k]) + ")"
            lines.append(f"| {lm} | {gen} | {batch} | " + " | ".join(cells(dl["by_batch"].get(batch))) + " | "
                         + " | ".join(cells(vg["by_batch"].get(batch))) + f" | {verdict.get('ops_ratio', '-')} | "
                         f"{mark} |")
    lines += ["", "## Device ops per replay step by op (mean over all replay steps)", ""]
    for a in arms:
        rs = replay_steps(a["result"])
        if rs:
            ops: Counter[str] = Counter()
            for c in rs:
                ops.update(c["by_op"])
            body = ", ".join(f"`{op}` {n / len(rs):.2f}" for op, n in ops.most_common())
            lines.append(f"- {a['result'].get('lmdeploy')} {a['generation']} {a['runner']}: {body}")
    lines += ["", "## Where the host syncs of replay steps come from (per replay step)", ""]
    for a in arms:
        sites = a["summary"].get("sync_sites_per_replay")
        if sites:
            lines.append(f"- {a['result'].get('lmdeploy')} {a['generation']} {a['runner']}: "
                         + ", ".join(f"`{k}` {v:g}" for k, v in sites.items()))
    lines += ["", "## Parity mismatches (first 4 per arm)", ""]
    for a in arms:
        ms = a["result"].get("mismatches") or []
        if ms:
            lines.append(f"- {a['result'].get('lmdeploy')} {a['generation']} {a['runner']} ({len(ms)}): "
                         + "; ".join(m.replace("|", "\\|") for m in ms[:4]))
    return lines


def pair(arms: list[dict[str, Any]], lmdeploy: str, generation: str, runner: str) -> dict[str, Any]:
    return next(a for a in arms if a["lmdeploy"] == lmdeploy and a["generation"] == generation
                and a["runner"] == runner)


def goals_by_pair(arms: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for a in arms:
        if a["runner"] != "dlinfer":
            continue
        try:
            vg = pair(arms, a["lmdeploy"], a["generation"], "vendor_graph")
        except StopIteration:
            continue
        out[(a["lmdeploy"], a["generation"])] = goal(a["summary"], vg["summary"])
    return out


def default_lmdeploys() -> list[str]:
    """The installed lmdeploy, and lmdeploy 0.17 where a copy of it sits in ``.h200/pkgs017``."""
    extra = _common.ROOT / ".h200" / "pkgs017"
    return ["installed", *([str(extra)] if (extra / "lmdeploy").is_dir() else [])]


def parent(args: argparse.Namespace) -> int:
    problem = _common.dlinfer_problem()
    if problem is not None:
        print(f"runner_vs_dlinfer: {problem}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    paths = [None if p == "installed" else str(Path(p).resolve()) for p in args.lmdeploy]
    jobs = [(lm, g, w) for lm in paths for g in args.generations for w in RUNNERS]
    arms: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="runner-vs-dlinfer-") as tmp, \
            ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [(job, pool.submit(run_child, *job, Path(tmp), args.steps, SEED, args.vendor_graph_src))
                   for job in jobs]
        for (lm, gen, which), future in futures:
            r = future.result()
            label = r.get("lmdeploy") or ("installed" if lm is None else lm)
            arms.append({"lmdeploy": label, "generation": gen, "runner": which, "result": r,
                         "summary": summarise(r)})
            print(f"lmdeploy {label} {gen} {which}: {'error: ' + r['error'][:160] if 'error' in r else 'ok'} "
                  f"({r.get('wall_s')} s)", flush=True)
    goals = {f"lmdeploy {lm} {gen}": v for (lm, gen), v in goals_by_pair(arms).items()}
    total = round(time.perf_counter() - t0, 1)
    payload = {"benchmark": NAME, "what": "device ops outside the graph, host syncs and seq-len update calls per "
               "replay step: vendor_graph's Ascend runner vs dlinfer's, lmdeploy tiny Llama, real dlinfer, "
               "simulated NPU (exact counts)",
               "goal": {"ops_ratio_max": GOAL_OPS_RATIO, "host_syncs_max": GOAL_HOST_SYNCS,
                        "rule": "per live batch: vendor_graph median device ops per replay step <= ratio x "
                                "dlinfer's, and vendor_graph max host syncs (syncs + d2h) per replay step <= max"},
               "schedule": {"seed": SEED, "sizes": list(SIZES), "steps": args.steps, "max_seqs": MAX_SEQS},
               "args": {k: v for k, v in vars(args).items() if k != "child"},
               "environment": _common.environment(), "total_s": total, "goal_by_pair": goals,
               "arms": arms}
    table = tables(arms, args)
    table += ["", f"Total wall time {total} s ({args.jobs} children at a time, OMP_NUM_THREADS="
              f"{os.environ.get('OMP_NUM_THREADS', '1')})."]
    json_path, md_path = _common.write_results(NAME, payload, table)
    print("\n".join(table))
    print(f"wrote {json_path} and {md_path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=3, metavar=("GENERATION", "RUNNER", "OUT"))
    parser.add_argument("--generations", nargs="+", default=list(GENERATIONS))
    parser.add_argument("--lmdeploy", nargs="+", default=None,
                        help="'installed' and/or folders holding another lmdeploy (put first on PYTHONPATH); "
                             "default: installed, plus .h200/pkgs017 where present")
    parser.add_argument("--vendor-graph-src", default=None,
                        help="a folder holding the vendor_graph package to measure instead of this checkout's "
                             "(e.g. a `git archive HEAD vendor_graph` export)")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--jobs", type=int, default=2, help="children at a time")
    args = parser.parse_args(argv)
    if args.child:
        generation, which, out = args.child
        if which not in RUNNERS:
            parser.error(f"RUNNER must be one of {RUNNERS}")
        return child(generation, which, Path(out), args.steps, args.seed)
    if args.lmdeploy is None:
        args.lmdeploy = default_lmdeploys()
    if args.vendor_graph_src is not None:
        args.vendor_graph_src = str(Path(args.vendor_graph_src).resolve())
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
