"""The replay step's cost, per vendor, lmdeploy release and seq-len path, in one file:
``benchmarks/results/step_cost.json`` and ``.md``.

* ``host_syncs_per_step`` and ``input_device_ops_per_step`` (max over every replay step of a seeded schedule):
  the tiny decoder through each vendor's real runner on the simulator (``vendor_graph_sim.device.opcount``),
  counted exactly. Host syncs are host waits on device work (synchronize, event synchronize, device-to-host
  reads); input device ops are the fill's and the context bind's device operations together.
* per batch point, ``vs_dlinfer_fill`` (dlinfer µs / vendor_graph µs, medians) and both fills' device
  operations per call: ``benchmarks/fill_vs_dlinfer.py``'s run of the real dlinfer fill beside vendor_graph's on
  identical plain CPU tensors (host time is timed on CPU tensors, never on the simulator).

The counts need lmdeploy installed, one release per run: each run replaces its release's rows and keeps the
others'. The fill comparison does not depend on the installed release (it runs every release's layout) and
is rerun unless ``--keep-fill``.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/step_cost.py [--keep-fill]
    PYTHONPATH=.h200/pkgs017 OMP_NUM_THREADS=1 .venv/bin/python benchmarks/step_cost.py --keep-fill
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
import fill_vs_dlinfer  # noqa: E402

SEED, STEPS, SEQS = 0, 48, 20  # the schedule of the counts
CASES = (("ascend", "graph-update"), ("ascend", "task-update"), ("camb", None), ("maca", None))
GOAL_FILL = fill_vs_dlinfer.GOAL  # vendor_graph's fill at least this many times faster than dlinfer's


def counts(release: str) -> list[dict]:
    from vendor_graph_sim import standins

    standins.use_standin_dlinfer_if_missing()  # lmdeploy's dlinfer backends import dlinfer
    from vendor_graph_sim.device.opcount import replay_step_ops

    from vendor_graph.upstream import compat

    rows = []
    for vendor, path in CASES:
        if release not in compat.SUPPORTED_SERIES[vendor]:
            continue
        log, mismatches = replay_step_ops(vendor, seqlen_path=path, seed=SEED, steps=STEPS, num_seqs=SEQS)
        replays = [s for s in log if s.kind == "replay"]
        rows.append({"vendor": vendor, "lmdeploy": release, "seqlen_path": path, "replay_steps": len(replays),
                     "host_syncs_per_step": max(s.host_syncs for s in replays),
                     "d2h_per_step": max(s.d2h for s in replays),
                     "input_device_ops_per_step": max(s.fill + s.bind for s in replays),
                     "device_ops_outside_graph_per_step": max(s.total for s in replays),
                     "parity_mismatches": len(mismatches)})
    return rows


def fill_points(reps: int, block: int) -> list[dict]:
    out = []
    for r in fill_vs_dlinfer.compare(reps, block):
        ops = r["ops"]
        out.append({"spec": r["spec"], "label": r["label"], "graph_batch": r["graph_batch"],
                    "live_batch": r["live_batch"], "schedule": r["schedule"],
                    "dlinfer_us": r["dlinfer_us"], "vendor_graph_us": r["vendor_graph_us"], "floor_us": r["floor_us"],
                    "vs_dlinfer_fill": r["vs_dlinfer_fill"], "goal_met": r["vs_dlinfer_fill"] >= GOAL_FILL,
                    "device_ops": {arm: max(o["device"] for o in ops[arm]) for arm in ("dlinfer", "vendor_graph")}})
    return out


def table(payload: dict) -> list[str]:
    lines = ["## Per replay step (simulator, exact; max over the schedule's replay steps)", "",
             "| vendor | lmdeploy | seq-len path | host syncs | device-to-host | input device ops | device ops outside "
             "the graph | replay steps | parity |", "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for release in sorted(payload["counts"]):
        for r in payload["counts"][release]:
            lines.append(f"| {r['vendor']} | {r['lmdeploy']} | {r['seqlen_path'] or '-'} | "
                         f"{r['host_syncs_per_step']} | {r['d2h_per_step']} | {r['input_device_ops_per_step']} | "
                         f"{r['device_ops_outside_graph_per_step']} | {r['replay_steps']} | "
                         f"{'ok' if r['parity_mismatches'] == 0 else r['parity_mismatches']} |")
    points = payload["fill"]
    met = sum(p["goal_met"] for p in points)
    lines += ["", f"## Fill against the real dlinfer fill (host µs per call on plain CPU tensors, medians; goal "
              f"{GOAL_FILL:g}x: met at {met} of {len(points)} points)", "",
              "| layout | point | dlinfer µs | vendor_graph µs | floor µs | **vs_dlinfer_fill** | device ops dlinfer / "
              "vendor_graph |", "|---|---|---:|---:|---:|---:|---|"]
    for p in points:
        mark = "" if p["goal_met"] else " (below goal)"
        lines.append(f"| {p['spec']} | {p['label']} | {p['dlinfer_us']:.1f} | {p['vendor_graph_us']:.1f} | "
                     f"{p['floor_us']:.1f} | **{p['vs_dlinfer_fill']:.2f}x**{mark} | "
                     f"{p['device_ops']['dlinfer']} / {p['device_ops']['vendor_graph']} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep-fill", action="store_true", help="keep the fill comparison already in the file")
    parser.add_argument("--reps", type=int, default=fill_vs_dlinfer.REPS)
    parser.add_argument("--block", type=int, default=fill_vs_dlinfer.BLOCK)
    args = parser.parse_args()
    logging.getLogger("lmdeploy").setLevel(logging.WARNING)
    from vendor_graph.upstream import compat

    release = compat.series(compat.installed_lmdeploy_version())
    path = _common.RESULTS / "step_cost.json"
    previous = json.loads(path.read_text()) if path.exists() else {}
    fill = previous.get("fill") if args.keep_fill and previous.get("fill") else fill_points(args.reps, args.block)
    payload = {"benchmark": "step_cost", "schedule": {"seed": SEED, "steps": STEPS, "seqs": SEQS},
               "goal_fill": GOAL_FILL, "counts": {**previous.get("counts", {}), release: counts(release)},
               "fill": fill, "environment": {**previous.get("environment", {}), release: _common.environment()}}
    json_path, md_path = _common.write_results("step_cost", payload, table(payload))
    print("\n".join(table(payload)))
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
