"""Device operations issued per replay step outside the graph, per vendor and seq-len update path,
counted exactly on the CPU graph simulator.

The tiny decoder runs a seeded schedule (batch changing every 3 steps, sequences retiring and being
replaced) through each vendor's real runner: vendor_graph's Ascend runner on a simulated torch_npu
(newest generation, each seq-len update path forced), and lmdeploy's own CUDAGraphRunner on the
simulator's CUDA-style graph API for Camb and MACA. Every runner call that replays a graph is counted
between its start and its end (fill, bind, seq-len update, replay, anything else), once with
vendor_graph's fill and once with the straightforward fill (one copy per field plus one fill per shrunk
dimension) swapped in, on the same schedule.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ops_per_step.py [--steps 64] [--seqs 24] [--seed 0]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402

CASES = (("ascend", "graph-update"), ("ascend", "task-update"), ("camb", None), ("maca", None))
PARTS = ("fill", "bind", "update", "replay", "other", "total")


def summarise(log: list) -> dict:
    replays = [s for s in log if s.kind == "replay"]
    out: dict = {"replay_steps": len(replays), "capture_steps": sum(s.kind == "capture" for s in log),
                 "eager_steps": sum(s.kind == "eager" for s in log)}
    for part in (*PARTS, "update_calls"):
        values = [getattr(s, part) for s in replays]
        out[part] = {"min": min(values), "median": statistics.median(values), "max": max(values)}
    fill_bind = [s.fill + s.bind for s in replays]
    out["fill_plus_bind"] = {"min": min(fill_bind), "median": statistics.median(fill_bind), "max": max(fill_bind)}
    ops: dict[str, int] = {}
    for s in replays:
        for op, n in s.by_op.items():
            ops[op] = ops.get(op, 0) + n
    out["by_op_per_replay"] = {op: round(n / len(replays), 3) for op, n in sorted(ops.items())}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--seqs", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="ops_per_step", help="results file stem (benchmarks/results/NAME.json)")
    args = parser.parse_args()
    logging.getLogger("lmdeploy").setLevel(logging.WARNING)
    from vendor_graph_sim import standins

    standins.use_standin_dlinfer_if_missing()  # lmdeploy's dlinfer backends import dlinfer
    from vendor_graph_sim.device.opcount import replay_step_ops

    from vendor_graph.upstream import compat

    release = compat.series(compat.installed_lmdeploy_version())
    results = []
    for vendor, path in CASES:
        row = {"vendor": vendor, "seqlen_path": path}
        if release not in compat.SUPPORTED_SERIES[vendor]:
            print(f"{vendor}: not supported on lmdeploy {release}; skipped", flush=True)
            continue
        for arm in ("vendor_graph", "separate_copies"):
            if arm == "vendor_graph":
                log, mismatches = replay_step_ops(vendor, seqlen_path=path, seed=args.seed, steps=args.steps,
                                                  num_seqs=args.seqs)
            else:
                with _common.separate_copies():
                    log, mismatches = replay_step_ops(vendor, seqlen_path=path, seed=args.seed, steps=args.steps,
                                                      num_seqs=args.seqs)
            row[arm] = summarise(log) | {"parity_mismatches": len(mismatches)}
            row[arm]["per_step"] = [{k: v for k, v in s.as_dict().items() if k != "by_op"} for s in log]
        results.append(row)
        ours = row["vendor_graph"]
        print(f"{vendor:7s} {path or '-':13s} fill+bind {ours['fill_plus_bind']} update {ours['update']} "
              f"update calls {ours['update_calls']} total {ours['total']}", flush=True)

    payload = {"benchmark": "ops_per_step", "what": "device operations per replay step outside the graph "
               "(simulator, exact)", "args": vars(args), "environment": _common.environment(), "results": results}
    table = ["| vendor | seq-len path | fill | bind | **fill + bind** | update (calls / device ops) | replay | "
             "other | total | separate-copies fill + bind | separate-copies total | replay steps | parity |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def rng(d: dict) -> str:
        return f"{d['min']}" if d["min"] == d["max"] else f"{d['min']}–{d['max']} (median {d['median']:g})"

    for row in results:
        a, b = row["vendor_graph"], row["separate_copies"]
        parity = "ok" if a["parity_mismatches"] == 0 and b["parity_mismatches"] == 0 else \
            f"{a['parity_mismatches']}/{b['parity_mismatches']} mismatches"
        table.append(f"| {row['vendor']} | {row['seqlen_path'] or '-'} | {rng(a['fill'])} | {rng(a['bind'])} | "
                     f"**{rng(a['fill_plus_bind'])}** | {rng(a['update_calls'])} / {rng(a['update'])} | "
                     f"{rng(a['replay'])} | {rng(a['other'])} | {rng(a['total'])} | {rng(b['fill_plus_bind'])} | "
                     f"{rng(b['total'])} | {a['replay_steps']} | {parity} |")
    json_path, md_path = _common.write_results(args.name, payload, table)
    print("\n".join(table))
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
