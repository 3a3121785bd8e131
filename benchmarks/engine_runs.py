"""lmdeploy's own engine and pipeline on the simulated NPU, recorded as a table: lmdeploy release x torch_npu
generation x model x case, graph mode by vendor_graph against ``eager_mode=True``, and dlinfer's own runner on
the same stack.

Each cell is one child interpreter per (release, generation, runner), a user's script
(:func:`vendor_graph_sim.engine.main`) started with ``VENDOR_GRAPH_SIM`` and ``VENDOR_GRAPH_DLINFER_SRC``, in the
release's test environment (``.venvs/test-lmdeploy-<version>``, scripts/setup-test-env.sh). The workload is the
conformance test's (tests/realstack/test_engine.py): 10 requests behind ``max_batch_size`` 6, seed 0. Cases: ``basic``
(a fixed 96-block cache) on every generation, ``prefix-auto`` (prefix caching, the cache sized from the simulated
free memory) on :data:`FULL`. Times are the simulator's CPU emulation (each pipeline's construction, warmup and
generation), never a device's.

    python benchmarks/engine_runs.py [--releases 0.16.0 0.17.0 0.18.0] [--generations G1 G5]
    python benchmarks/engine_runs.py --dlinfer post-350

Writes ``benchmarks/results/engine_runs.{json,md}``. ``--dlinfer post-350`` runs the same table on dlinfer after
its PR #350 (:func:`vendor_graph_sim.overlay.overlaid`: that commit's files laid over a50184e), whose import-time
check admits only a torch_npu of torch's own major.minor: torch here is 2.13, so the simulated torch_npu is 2.13.0
(G5), and :data:`REFUSED_POST_350` (G2a, and G5's default 2.9.0.post9) are run to record the refusal; it writes
``benchmarks/results/engine_runs_post350.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import dlinfer_problem, write_results  # noqa: E402

RELEASES = ("0.16.0", "0.17.0", "0.18.0")
GENERATIONS = ("G0", "G1", "G2a", "G2b", "G2c", "G3a", "G3b", "G4", "G5")
FULL = "G5"
SEED = 0
POST_350 = "2.13.0"  # the torch_npu a post-#350 dlinfer admits beside torch 2.13 (G5)
REFUSED_POST_350 = ("G2a", "G5")  # G5 runs as 2.9.0.post9 (dlinfer's pins): refused for its major.minor


def child(python: Path, generation: str, *args: str, dlinfer: Path | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        env = {k: v for k, v in os.environ.items() if k not in ("VENDOR_GRAPH_VENDOR", "PYTHONPATH")}
        env.update(VENDOR_GRAPH_SIM=generation, OMP_NUM_THREADS="1")
        if dlinfer is not None:
            env["VENDOR_GRAPH_DLINFER_SRC"] = str(dlinfer)
        started = time.perf_counter()
        proc = subprocess.run([str(python), "-m", "vendor_graph_sim.engine", str(out), "--seed", str(SEED), *args],
                              capture_output=True, text=True, timeout=1200, env=env, cwd=tmp)
        seconds = round(time.perf_counter() - started, 1)
        if not out.is_file():
            lines = [line.split(" - ")[-1] for line in (proc.stdout + proc.stderr).splitlines() if "Error" in line]
            return {"generation": generation, "process_seconds": seconds, "refused": lines[-1] if lines else
                    f"exit {proc.returncode}"}
        return {"generation": generation, "process_seconds": seconds, **json.loads(out.read_text())}


def decode_eager(run: dict[str, Any]) -> str:
    reasons = {k: v for k, v in run["eager_reasons"].items() if k != "not a decode step"}
    return ", ".join(f"{v} {k}" for k, v in reasons.items()) or "0"


def rows(release: str, record: dict[str, Any], runner: str) -> list[str]:
    generation = record["generation"]
    if "refused" in record:
        return [f"| {release} | {generation} | all | all | {runner} | refused: {record['refused'][-140:]} "
                f"| | | | | |"]
    out = []
    for r in record["results"]:
        if "error" in r:
            out.append(f"| {release} | {generation} ({record['torch_npu']}) | {r['model']} | {r['case']} | {runner} "
                       f"| error: {r['error'][:140]} | | | | | |")
            continue
        g, e = r["graph"], r["eager"]
        if not any(g["tokens"]) and not any(e["tokens"]):
            out.append(f"| {release} | {generation} ({record['torch_npu']}) | {r['model']} | {r['case']} | {runner} "
                       f"| no token in either mode: lmdeploy's engine ended every request on an error of its "
                       f"forward loop (logged, not raised) | {g['captures']} | {g['replays']} | | | |")
            continue
        out.append(
            f"| {release} | {generation} ({record['torch_npu']}) | {r['model']} | {r['case']} | {runner} | "
            f"{'**yes**' if r['tokens_equal'] else 'NO: ' + str(r['first_difference'])} ({g['requests']} requests, "
            f"{sum(len(t) for t in g['tokens'])} tokens) | {g['captures']} | {g['replays']} | {decode_eager(g)} | "
            f"{g['num_blocks']} | {g['seconds']} / {e['seconds']} |")
    return out


def _recorded(record: dict[str, Any]) -> dict[str, Any]:
    """A record without the per-request tokens and texts (their counts stay; equality is ``tokens_equal``)."""
    out = dict(record)
    results = []
    for result in record.get("results", []):
        result = dict(result)
        for mode in ("eager", "graph"):
            if mode in result:
                run = dict(result[mode])
                run["tokens"] = [len(t) for t in run["tokens"]]
                run.pop("texts", None)
                result[mode] = run
        results.append(result)
    out["results"] = results
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--releases", nargs="+", default=list(RELEASES))
    parser.add_argument("--generations", nargs="+", default=list(GENERATIONS))
    parser.add_argument("--venvs", type=Path, default=ROOT / ".venvs")
    parser.add_argument("--dlinfer", choices=("a50184e", "post-350"), default="a50184e",
                        help="post-350: dlinfer PR #350's files laid over a50184e (see the module's docstring)")
    args = parser.parse_args()
    problem = dlinfer_problem()
    if problem is not None:
        parser.error(f"{problem} (the engine runs the real dlinfer)")
    tree = None
    if args.dlinfer == "post-350":
        from vendor_graph_sim import overlay, realstack

        origin, root = realstack.dlinfer_origin()
        tree = overlay.overlaid(root if origin == "source" else overlay.default_base())
    records = []
    last = args.releases[-1]
    for release in args.releases:
        python = args.venvs / f"test-lmdeploy-{release}" / "bin" / "python"
        if not python.is_file():
            parser.error(f"{python} is missing: bash scripts/setup-test-env.sh {release}")
        if tree is not None:
            full, generations = POST_350, [POST_350, *(REFUSED_POST_350 if release == last else ())]
        else:
            full = FULL
            generations = args.generations if release == last else [g for g in (FULL,) if g in args.generations]
        for generation in generations:
            cases = ["basic", "prefix-auto"] if generation == full else ["basic"]
            print(f"lmdeploy {release}, {generation}: vendor_graph", file=sys.stderr, flush=True)
            records.append({"release": release, "runner": "vendor_graph",
                            **child(python, generation, "--cases", *cases, dlinfer=tree)})
        if tree is not None or FULL in args.generations:
            for runner in ("dlinfer", "dlinfer-bare"):
                print(f"lmdeploy {release}, {full}: {runner}", file=sys.stderr, flush=True)
                records.append({"release": release, "runner": runner,
                                **child(python, full, "--runner", runner, "--models", "lmdeploy-llama",
                                        dlinfer=tree)})
    dlinfer = ("dlinfer a50184e" if tree is None else
               "dlinfer after PR #350: its commit ae9862a1's changed files laid over a50184e")
    command = "python benchmarks/engine_runs.py" + ("" if tree is None else " --dlinfer post-350")
    table = ["# lmdeploy's engine and pipeline on the simulated NPU", "",
             f"`{command}` (seed {SEED}; 10 requests behind max_batch_size 6; greedy; `VENDOR_GRAPH_DLINFER_SRC`: "
             f"{dlinfer}). Runner `vendor_graph`: `import vendor_graph.ascend` first; `dlinfer`: vendor_graph not "
             "imported, only its bridges installed; `dlinfer-bare`: nothing of vendor_graph. Eager decode steps: "
             "graph mode's decode steps that ran eager, by reason (prefills are not decode steps). Seconds: CPU "
             "emulation per pipeline (build, warmup, generation), graph / eager; each process's first pipeline "
             "(eager, basic) also pays its one-time imports.",
             "",
             "| lmdeploy | torch_npu | model | case | runner | tokens equal to eager | captures | replays | "
             "eager decode steps | KV blocks | seconds |", "|---" * 11 + "|"]
    for record in records:
        table += rows(record["release"], record, record["runner"])
    write_results("engine_runs" if tree is None else "engine_runs_post350",
                  {"seed": SEED, "dlinfer": args.dlinfer, "records": [_recorded(r) for r in records]}, table)
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
