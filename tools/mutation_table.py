#!/usr/bin/env python3
"""Which ordinary tests catch each classic failure put back: the mutation table.

For every mutation of tests/mutations/test_classic_failures.py (one line of shipped code changed), runs
the ordinary parity and conformance tests below, plus the guard tests that mutation names, on a mutated
copy of the package, and records every test that failed. A mutation no test catches is reported as such
and makes the exit status 1. Writes benchmarks/results/mutations.json and the table as markdown (.md).

    .venv/bin/python tools/mutation_table.py
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "mutations.json"
# The ordinary suite: decode parity on the task-update and graph-update generations, both Camb/MACA
# paths, batches shrinking within their bucket, and seeded random schedules.
PARITY = "tests/conformance/test_decode_parity.py"
ORDINARY = (PARITY, "tests/conformance/test_random_schedules.py", "tests/conformance/test_camb_maca_lmdeploy_path.py")
SELECT = ("fia-G1 or fia-G5 or paged_attention-G5 or camb or maca or shrinking or random_schedule"
          " or goes_through_lmdeploys_attention")  # the shrinking schedule includes G5-mla (MLA's KV scatter)
RANDOM_SCHEDULES = "20"


def _mutations_module():
    spec = importlib.util.spec_from_file_location("classic_failures", ROOT / "tests/mutations/test_classic_failures.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(OUT), help="the JSON record (the markdown table goes beside it, .md)")
    parser.add_argument("--render", action="store_true", help="only write the markdown of an existing record")
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="run only the mutations whose name contains TEXT (repeatable) and update their rows in "
                             "the existing record, keeping the others")
    args = parser.parse_args(argv)
    if args.render:
        record = json.loads(Path(args.out).read_text())
        Path(args.out).with_suffix(".md").write_text(table(record) + "\n")
        return 0
    os.environ["VENDOR_GRAPH_RANDOM_SCHEDULES"] = RANDOM_SCHEDULES
    mod = _mutations_module()
    rows, uncaught = [], 0
    for m in mod.MUTATIONS:
        if not m.applies(mod.RELEASE) or (args.only and not any(t in m.name for t in args.only)):
            continue
        started = time.time()
        with tempfile.TemporaryDirectory() as tmp:
            where = mod._mutated_tree(Path(tmp), m)
            ordinary = mod._pytest(where, list(ORDINARY), "-k", SELECT)
            guards = mod._pytest(where, list(m.tests))
        caught = sorted(set(re.findall(r"^FAILED (\S+)", ordinary.stdout, flags=re.M)))
        guard_caught = sorted(set(re.findall(r"^FAILED (\S+)", guards.stdout, flags=re.M)))
        rows.append({"mutation": m.name, "file": f"vendor_graph/{m.path}",
                     "ordinary_tests_failing": [_short(t) for t in caught],
                     "guard_tests_failing": [_short(t) for t in guard_caught],
                     "seconds": round(time.time() - started, 1)})
        uncaught += not caught and not guard_caught
        print(f"{m.name}: {len(caught)} ordinary, {len(guard_caught)} guard tests fail", flush=True)
    if args.only and Path(args.out).exists():  # keep the other rows, in the order of MUTATIONS
        fresh = {r["mutation"]: r for r in rows}
        kept = {r["mutation"]: r for r in json.loads(Path(args.out).read_text())["mutations"]}
        rows = [fresh.get(m.name) or kept[m.name] for m in mod.MUTATIONS if m.name in fresh or m.name in kept]
    record = {"lmdeploy_series": mod.RELEASE, "ordinary_suite": list(ORDINARY), "selected": SELECT,
              "random_schedules": int(RANDOM_SCHEDULES), "mutations": rows}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    Path(args.out).with_suffix(".md").write_text(table(record) + "\n")
    print(table(record))
    return 1 if uncaught else 0


def _short(test_id: str) -> str:
    return test_id[test_id.index("tests/"):] if "tests/" in test_id else test_id


def table(record: dict) -> str:
    lines = ["| mutation | ordinary tests that fail | its guard tests that fail |", "|---|---|---|"]
    for r in record["mutations"]:
        names = [t.split("::", 1)[-1] for t in r["ordinary_tests_failing"]]
        shown = ", ".join(f"`{n}`" for n in names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        guards = ", ".join(f"`{t.split('::', 1)[-1]}`" for t in r["guard_tests_failing"])
        lines.append(f"| {r['mutation']} | {len(names)}: {shown or 'none'} | {guards or 'none'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
