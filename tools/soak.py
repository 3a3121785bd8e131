#!/usr/bin/env python3
"""Soak the conformance check: run any number of seeded random decode schedules on the simulator.

Each schedule draws its vendor (those the installed lmdeploy supports), torch_npu generation,
attention op, batch sizes and sequence lengths from its seed (vendor_graph_sim.schedules), runs
graph and eager side by side, and checks every step (bitwise parity, greedy tokens, stale padding
rows, every KV byte). The run is recorded as JSON: what ran, how long, and every failing seed with
its mismatches, so a failure is reproducible with ``--start SEED --count 1``.

    .venv/bin/python tools/soak.py --count 1000 --out soak.json

``--property N`` runs the property-based check instead (vendor_graph_sim.properties: hypothesis
draws N schedules of batches, prompt lengths and retirements for the Ascend runner; graph equals
eager and no KV byte changes outside the live slots), seeded by ``--start``; a failure is shrunk and
recorded with its schedule.

    .venv/bin/python tools/soak.py --property 2000 --start 7 --out soak-property.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections import Counter
from importlib import metadata


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200, help="schedules to run")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--out", default="soak.json", help="where to write the JSON record")
    parser.add_argument("--property", type=int, default=None, metavar="N",
                        help="run N hypothesis examples of the property-based check instead (seed: --start)")
    args = parser.parse_args(argv)
    if args.property is not None:
        return soak_property(args)

    from vendor_graph_sim import device as sim
    from vendor_graph_sim import standins

    standins.use_standin_dlinfer_if_missing()  # lmdeploy's Ascend backend imports dlinfer
    from vendor_graph_sim.schedules import case, run_case

    sim.install()
    started = time.time()
    failures, configs = [], Counter()
    for seed in range(args.start, args.start + args.count):
        c = case(seed)
        configs[f"{c.vendor}/{c.generation or '-'}/{c.attention if c.vendor == 'ascend' else '-'}"] += 1
        try:
            mismatches = run_case(c).mismatches
        except Exception as exc:  # a crash is a failure of that seed, not of the soak
            mismatches = [f"{type(exc).__name__}: {exc}"]
        if mismatches:
            failures.append({"seed": seed, "case": str(c), "mismatches": mismatches[:10]})
            print(f"FAIL {c}: {mismatches[0]}", flush=True)
    record = {
        "schedules": args.count, "first_seed": args.start, "failures": failures,
        "seconds": round(time.time() - started, 1), "configurations": dict(sorted(configs.items())),
    }
    _write_record(args.out, record)
    print(f"soak: {args.count - len(failures)} passed, {len(failures)} failed in {record['seconds']} s "
          f"(record: {args.out})")
    return 1 if failures else 0


def _write_record(path: str, record: dict) -> None:
    """The soak record as JSON, with the versions and the time it finished."""
    record.update(lmdeploy=metadata.version("lmdeploy"), torch=metadata.version("torch"),
                  python=platform.python_version(), finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    with open(path, "w") as fh:
        json.dump(record, fh, indent=2, sort_keys=True)
        fh.write("\n")


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
    _write_record(args.out, record)
    print(f"soak --property: {args.property} examples {'FAILED' if failure else 'passed'} in {record['seconds']} s "
          f"(record: {args.out})")
    return 1 if failure else 0


if __name__ == "__main__":
    sys.exit(main())
