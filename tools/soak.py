#!/usr/bin/env python3
"""Soak the conformance check: run any number of seeded random decode schedules on the simulator.

Each schedule draws its whole configuration and workload from its seed (vendor_graph_sim.schedules:
vendor, torch_npu generation, attention op, query tokens per step, max_batches, capture sizes, batches
jumping across buckets and shrinking within one, sequences joining and finishing, KV caches moved and
weights updated mid-run), runs graph and eager side by side and checks every step (bitwise hidden
states, greedy tokens, no stale padding row, every KV byte equal to eager's, which writes only the
live sequences' slots).

The record (``--out``, default benchmarks/results/soak.json) is also the soak's state: the seed ranges
done, schedules and divergences by configuration and by dimension, and every failing seed with its
schedule and mismatches (reproduce one with ``--start SEED --count 1 --out /tmp/one.json``). Running
again with the same ``--out`` adds the seeds of ``--start``/``--count`` not done yet, so a soak can stop
and go on; a record made by another schedule generator is refused. ``--workers`` runs that many
processes (one schedule at a time each, single-threaded).

    .venv/bin/python tools/soak.py --count 10000 --workers 2

``--property N`` runs the property-based check instead (vendor_graph_sim.properties: hypothesis
draws N schedules of batches, prompt lengths and retirements for the Ascend runner; graph equals
eager and no KV byte changes outside the live slots), seeded by ``--start``; a failure is shrunk and
recorded with its schedule.

    .venv/bin/python tools/soak.py --property 2000 --start 7 --out soak-property.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from importlib import metadata
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "soak.json"
CHUNK = 10  # seeds per task handed to a worker (the record is rewritten after each)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200, help="schedules to run (seeds --start .. --start+count-1)")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--workers", type=int, default=1, help="processes running schedules (default 1)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="the record: read to resume, rewritten as it runs")
    parser.add_argument("--property", type=int, default=None, metavar="N",
                        help="run N hypothesis examples of the property-based check instead (seed: --start)")
    parser.add_argument("--render", action="store_true", help="only rewrite the markdown beside the record")
    args = parser.parse_args(argv)
    if args.render:
        record = json.loads(Path(args.out).read_text())
        Path(args.out).with_suffix(".md").write_text("\n".join(_markdown(record)) + "\n")
        return 0
    if args.count < 1 or args.workers < 1 or args.start < 0:
        parser.error("--count and --workers must be positive, --start not negative")
    if args.property is not None:
        return soak_property(args)
    record = _load(Path(args.out))
    todo = [s for s in range(args.start, args.start + args.count) if not _done(record, s)]
    print(f"soak: {len(todo)} of seeds {args.start}..{args.start + args.count - 1} to run "
          f"({record['schedules']} in the record), {args.workers} worker(s)", flush=True)
    started, wall_before = time.time(), record["wall_seconds"]
    run = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": _commit(),
           "workers": args.workers, "where": _where(args.workers), "schedules": 0, "wall_seconds": 0.0}
    record["runs"].append(run)
    chunks = [todo[i:i + CHUNK] for i in range(0, len(todo), CHUNK)]
    with ProcessPoolExecutor(args.workers, mp_context=get_context("spawn"), initializer=_worker_setup) as pool:
        pending = {pool.submit(_run_seeds, chunk) for chunk in chunks[:args.workers * 2]}
        queued = iter(chunks[args.workers * 2:])
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                results = future.result()
                _merge(record, results)
                run["schedules"] += len(results)
                nxt = next(queued, None)
                if nxt is not None:
                    pending.add(pool.submit(_run_seeds, nxt))
            run["wall_seconds"] = round(time.time() - started, 1)
            record["wall_seconds"] = round(wall_before + run["wall_seconds"], 1)
            _write_record(Path(args.out), record)
    ran = len(todo)
    print(f"soak: ran {ran} schedules in {time.time() - started:.0f} s; the record holds {record['schedules']} "
          f"schedules, {record['divergences']} divergent (record: {args.out})")
    return 1 if record["divergences"] else 0


def _generator() -> str:
    """A fingerprint of what the seeds mean: the first schedules the generator draws, whole (a generator
    that draws other schedules for the same seeds gets another)."""
    from vendor_graph_sim import standins

    standins.use_standin_dlinfer_if_missing()
    from vendor_graph_sim.harness import prompts
    from vendor_graph_sim.schedules import case

    drawn = "".join(f"{case(s)!r}{prompts(case(s).num_seqs, s)}" for s in range(64))
    return hashlib.sha256(drawn.encode()).hexdigest()[:16]


def _load(path: Path) -> dict:
    empty = {"schedules": 0, "divergences": 0, "seeds": [], "by_config": {}, "by_dimension": {},
             "failures": [], "steps": 0, "graph": {"captures": 0, "replays": 0, "stale_recaptures": 0,
                                                  "eager_steps": 0},
             "worker_seconds": 0.0, "wall_seconds": 0.0, "runs": []}
    if not path.exists():
        return {**empty, "generator": _generator()}
    record = json.loads(path.read_text())
    if record.get("generator") != _generator():
        raise SystemExit(f"{path} was made by another schedule generator ({record.get('generator')}, now "
                         f"{_generator()}): its seeds meant other schedules; give --out a new file")
    return record


def _done(record: dict, seed: int) -> bool:
    return any(lo <= seed <= hi for lo, hi in record["seeds"])


def _add_seed(ranges: list[list[int]], seed: int) -> list[list[int]]:
    """``ranges`` (sorted, disjoint [first, last] pairs) with ``seed`` added, merged."""
    out: list[list[int]] = []
    for lo, hi in sorted([*ranges, [seed, seed]]):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return out


def _worker_setup() -> None:
    import gc

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from vendor_graph_sim import device as sim
    from vendor_graph_sim import standins

    standins.use_standin_dlinfer_if_missing()  # lmdeploy's Ascend backend imports dlinfer
    import vendor_graph_sim.schedules  # noqa: F401  (imports lmdeploy's backends before the freeze)

    sim.install()
    gc.collect()
    gc.freeze()  # the imports are never garbage: each capture's gc.collect() walks only what schedules make


def _run_seeds(seeds: list[int]) -> list[dict]:
    import logging

    from vendor_graph_sim import device as sim
    from vendor_graph_sim.schedules import case, run_case

    logging.getLogger("vendor_graph").setLevel(logging.ERROR)  # stale recaptures, G0's eager notice: expected
    logging.getLogger("lmdeploy").setLevel(logging.ERROR)
    out = []
    for seed in seeds:
        c = case(seed)
        started = time.time()
        graph = {}
        try:
            pair = run_case(c)
            mismatches = pair.mismatches
            stats = pair.runner.stats
            graph = {"captures": stats.captures, "replays": stats.replays,
                     "stale_recaptures": sum(b.stale_recaptures for b in stats.buckets.values()),
                     "eager_steps": sum(stats.eager_steps.values())}
        except Exception as exc:  # a crash is a divergence of that seed, not the end of the soak
            mismatches = [f"{type(exc).__name__}: {exc}"]
            sim.discard_queued_work()  # what it left queued would fail the seeds after it too
        out.append({"seed": seed, "case": str(c), "config": c.config, "dimensions": c.dimensions(),
                    "steps": len(c.plan), "graph": graph, "mismatches": mismatches[:10],
                    "seconds": time.time() - started})
    return out


def _merge(record: dict, results: list[dict]) -> None:
    for r in results:
        failed = bool(r["mismatches"])
        record["seeds"] = _add_seed(record["seeds"], r["seed"])
        record["schedules"] += 1
        record["divergences"] += failed
        record["steps"] += r["steps"]
        record["worker_seconds"] = round(record["worker_seconds"] + r["seconds"], 1)
        for key, value in r["graph"].items():
            record["graph"][key] += value
        by = record["by_config"].setdefault(r["config"], {"schedules": 0, "divergences": 0})
        by["schedules"] += 1
        by["divergences"] += failed
        for dim, value in r["dimensions"].items():
            counts = record["by_dimension"].setdefault(dim, {})
            counts[value] = counts.get(value, 0) + 1
        if failed:
            record["failures"].append({"seed": r["seed"], "case": r["case"], "mismatches": r["mismatches"]})
            print(f"FAIL {r['case']}: {r['mismatches'][0]}", flush=True)


def _commit() -> str:
    """The repository's commit, marked ``+changes`` when the tree differs from it (unknown outside git)."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def _where(workers: int) -> str:
    return f"{platform.machine()} host, {os.cpu_count()} CPUs, {workers} worker process(es), the simulator"


def _write_record(path: Path, record: dict) -> None:
    """The record as JSON (atomically), with the versions it ran on and when it was last written."""
    from vendor_graph.ops.reports import write_atomic

    record.update(lmdeploy=metadata.version("lmdeploy"), torch=metadata.version("torch"),
                  python=platform.python_version(), updated=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    for key in ("by_config", "by_dimension"):
        record[key] = {k: record[key][k] for k in sorted(record[key])}
    record["by_dimension"] = {k: dict(sorted(v.items())) for k, v in record["by_dimension"].items()}
    write_atomic(path, json.dumps(record, indent=1) + "\n")
    write_atomic(path.with_suffix(".md"), "\n".join(_markdown(record)) + "\n")


def _markdown(record: dict) -> list[str]:
    seeds = ", ".join(f"{lo}-{hi}" for lo, hi in record["seeds"])
    lines = [f"# Soak: {record['schedules']} schedules, {record['divergences']} divergent", "",
             f"Seeds {seeds}; {record['steps']} decode steps; {record['graph']['captures']} captures, "
             f"{record['graph']['replays']} replays, {record['graph']['stale_recaptures']} stale-graph recaptures, "
             f"{record['graph']['eager_steps']} eager steps; {record['wall_seconds']} s wall, "
             f"{record['worker_seconds']} s in workers; lmdeploy {record['lmdeploy']}, torch {record['torch']}.", "",
             "| configuration | schedules | divergent |", "|---|---|---|"]
    lines += [f"| {name} | {c['schedules']} | {c['divergences']} |" for name, c in record["by_config"].items()]
    lines += ["", "| dimension | schedules by value |", "|---|---|"]
    lines += [f"| {dim} | " + ", ".join(f"{v}: {n}" for v, n in values.items()) + " |"
              for dim, values in record["by_dimension"].items()]
    return lines


def soak_property(args: argparse.Namespace) -> int:
    from vendor_graph_sim import device as sim
    from vendor_graph_sim import properties, standins

    standins.use_standin_dlinfer_if_missing()

    sim.install()
    started = time.time()
    failure = None
    try:
        properties.property_test(args.property, derandomize=False, seed=args.start)()
    except Exception as exc:  # the shrunk failing example, with its schedule
        failure = f"{type(exc).__name__}: {exc}"
        print(f"FAIL {failure[:2000]}", flush=True)
    record = {
        "property_examples": args.property, "seed": args.start, "failure": failure,
        "seconds": round(time.time() - started, 1),
    }
    _write_record(Path(args.out), record)
    print(f"soak --property: {args.property} examples {'FAILED' if failure else 'passed'} in {record['seconds']} s "
          f"(record: {args.out})")
    return 1 if failure else 0


if __name__ == "__main__":
    sys.exit(main())
