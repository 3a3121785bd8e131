"""Summarise the H200 results in ``benchmarks/results/h200/`` (written by ``benchmarks/h200.sh``) into
``summary.json``, ``summary.md`` and, where matplotlib is importable, ``h200.png``; each figure is
held to the goal issue 5 sets, with the ratio and whether it is met.

    python benchmarks/report_h200.py [RESULTS_DIR]
"""

from __future__ import annotations

import json
import statistics
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

DEFAULT = Path(__file__).parent / "results" / "h200"


def load(folder: Path, name: str):
    path = folder / name
    return json.loads(path.read_text()) if path.exists() else None


def conformance(folder: Path) -> dict | None:
    path = folder / "conformance.xml"
    if not path.exists():
        return None
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    ran = [c.get("name") for c in suite.iter("testcase") if c.find("skipped") is None]
    return {**counts, "passed": passed, "ran": ran}


def summarise(folder: Path) -> dict:
    out: dict = {"goals": []}

    def goal(name: str, measured: float, target: str, met: bool, how: str) -> None:
        out["goals"].append({"goal": name, "measured": measured, "target": target, "met": met, "how": how})

    latency = load(folder, "latency.json")
    if latency:
        rows = [r for r in latency["rows"] if "batch" in r]
        out["latency"] = rows
        tiny1 = next((r for r in rows if r["model"] == "tiny" and r["batch"] == 1), None)
        if tiny1:
            goal("graph vs eager, tiny model, batch 1", tiny1["speedup_median"], ">= 5x",
                 tiny1["speedup_median"] >= 5, "median step time, synchronised per step")
    replay = load(folder, "replay.json")
    if replay:
        out["replay"] = replay
        goal("runner's whole replay step vs bare CUDAGraph.replay(), ~1B model, batch 1",
             replay["overhead_median"], "<= +10%", replay["overhead_median"] <= 0.10, "median, interleaved")
    capture = load(folder, "capture.json")
    if capture:
        out["capture"] = capture
    runs = {m: [json.loads(p.read_text()) for p in sorted(folder.glob(f"engine_{m}_r*.json"))]
            for m in ("vendor", "lmdeploy")}
    if all(runs.values()):
        rows = []
        for batch in runs["vendor"][0]["batches"]:
            pooled = {m: [t for r in rs for t in r["batches"][batch]["tpot_ms"]] for m, rs in runs.items()}
            per_run = {m: [r["batches"][batch]["median_ms"] for r in rs] for m, rs in runs.items()}
            tokens = [r["tokens"][batch] for rs in runs.values() for r in rs]
            complete = all(len(t) == 144 for ts in tokens for t in ts)  # every request ran to the end
            same = complete and all(ts == tokens[0] for ts in tokens)
            med = {m: statistics.median(v) for m, v in pooled.items()}
            rows.append({"batch": int(batch), "vendor_median_ms": med["vendor"], "vendor_min_ms": min(pooled["vendor"]),
                         "lmdeploy_median_ms": med["lmdeploy"], "lmdeploy_min_ms": min(pooled["lmdeploy"]),
                         "vendor_run_medians_ms": per_run["vendor"], "lmdeploy_run_medians_ms": per_run["lmdeploy"],
                         "ratio_median": med["vendor"] / med["lmdeploy"],
                         "ratio_min": min(pooled["vendor"]) / min(pooled["lmdeploy"]), "greedy_tokens_equal": same})
            goal(f"engine TPOT, vendor_graph.cuda vs lmdeploy graph, batch {batch}", rows[-1]["ratio_median"],
                 "<= 1.0 (no worse), tokens equal", 0 < rows[-1]["ratio_median"] <= 1.0 and same,
                 f"median of {len(pooled['vendor'])} repeats over {len(runs['vendor'])} alternating engine runs "
                 f"per mode; greedy tokens equal: {same}")
        last = runs["vendor"][-1]
        out["engine"] = {"rows": rows, "vendor_graph": last.get("vendor_graph"),
                         "build_s": {m: [r["engine_build_s"] for r in rs] for m, rs in runs.items()}}
    conf = conformance(folder)
    if conf:
        out["conformance"] = conf
    for name in ("latency", "replay", "capture"):
        data = load(folder, f"{name}.json")
        if data:
            out["device"], out["torch"] = data.get("device"), data.get("torch")
            break
    return out


def markdown(s: dict) -> str:
    lines = [f"# H200 results ({s.get('device', '?')}, torch {s.get('torch', '?')})", ""]
    lines += ["## Goals", "", "| goal | measured | target | met |", "|---|---:|---|---|"]
    for g in s["goals"]:
        value = f"{g['measured']:+.1%}" if "replay" in g["goal"] else f"{g['measured']:.2f}"
        lines.append(f"| {g['goal']} ({g['how']}) | {value} | {g['target']} | {'yes' if g['met'] else '**no**'} |")
    if "latency" in s:
        lines += ["", "## Decode step latency (ms, synchronised per step; median / min)", "",
                  "| model | params | batch | eager | graph | speed-up |", "|---|---:|---:|---:|---:|---:|"]
        for r in s["latency"]:
            lines.append(f"| {r['model']} | {r['params'] / 1e6:.1f} M | {r['batch']} | "
                         f"{r['eager']['median_ms']:.3f} / {r['eager']['min_ms']:.3f} | "
                         f"{r['graph']['median_ms']:.3f} / {r['graph']['min_ms']:.3f} | {r['speedup_median']:.2f}x |")
    if "replay" in s:
        r = s["replay"]
        lines += ["", "## Replay step vs bare replay (batch 1, ms; median / min)", "",
                  f"runner step {r['runner_step']['median_ms']:.3f} / {r['runner_step']['min_ms']:.3f}; "
                  f"bare `CUDAGraph.replay()` {r['bare_replay']['median_ms']:.3f} / {r['bare_replay']['min_ms']:.3f}; "
                  f"overhead {r['overhead_median']:+.1%} (median), {r['overhead_min']:+.1%} (min); "
                  f"{r['runner_step']['reps']} interleaved pairs."]
    if "engine" in s:
        e = s["engine"]
        lines += ["", "## lmdeploy engine, time per output token (ms; median / min over all repeats)", "",
                  "| batch | vendor_graph.cuda | lmdeploy graph | ratio of medians | ratio of minima | "
                  "per-run medians, vendor | per-run medians, lmdeploy | greedy tokens equal |",
                  "|---:|---:|---:|---:|---:|---|---|---|"]
        for r in e["rows"]:
            runs_v = ", ".join(f"{x:.2f}" for x in r["vendor_run_medians_ms"])
            runs_l = ", ".join(f"{x:.2f}" for x in r["lmdeploy_run_medians_ms"])
            lines.append(f"| {r['batch']} | {r['vendor_median_ms']:.3f} / {r['vendor_min_ms']:.3f} | "
                         f"{r['lmdeploy_median_ms']:.3f} / {r['lmdeploy_min_ms']:.3f} | {r['ratio_median']:.3f} | "
                         f"{r['ratio_min']:.3f} | {runs_v} | {runs_l} | {r['greedy_tokens_equal']} |")
        vg = e.get("vendor_graph") or {}
        if vg:
            lines += ["", f"vendor_graph in the engine: active vendor `{vg.get('active')}`, runner "
                          f"`{', '.join(vg.get('runners', []))}`, {vg.get('replays')} replays.", "", "```",
                      *vg.get("stats", []), "```"]
    if "capture" in s:
        c = s["capture"]
        total = c.get("graph_memory_bytes_total")
        lines += ["", f"## Capture of every Ascend bucket at max_batches {c['max_batches']} "
                      f"({len(c['sizes'])} graphs, ~{c['params'] / 1e9:.2f} B-parameter model, largest first)", "",
                  f"total capture time {c['total_capture_seconds']:.2f} s; memory held by the graphs "
                  f"{'n/a' if total is None else f'{total / 2**20:.1f} MiB'}", "",
                  "| bucket | capture s | capture MiB |", "|---:|---:|---:|"]
        for r in c["rows"]:
            mib = "-" if r["capture_bytes"] is None else f"{r['capture_bytes'] / 2**20:.1f}"
            lines.append(f"| {r['bucket']} | {r['capture_seconds']:.3f} | {mib} |")
    if "conformance" in s:
        c = s["conformance"]
        lines += ["", "## Conformance on real CUDA graphs", "",
                  f"`pytest tests/conformance --graph-backend cuda`: {c['passed']} passed, "
                  f"{c['failures'] + c['errors']} failed, {c['skipped']} skipped (simulator-only checks)."]
    return "\n".join(lines) + "\n"


def plot(s: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for model, marker in (("tiny", "o"), ("large", "s")):
        rows = [r for r in s.get("latency", []) if r["model"] == model]
        if rows:
            b = [r["batch"] for r in rows]
            axes[0].plot(b, [r["eager"]["median_ms"] for r in rows], marker=marker, label=f"{model} eager")
            axes[0].plot(b, [r["graph"]["median_ms"] for r in rows], marker=marker, ls="--", label=f"{model} graph")
    axes[0].set(xscale="log", yscale="log", xlabel="batch", ylabel="ms per decode step",
                title="decode step, eager vs graph (H200)")
    axes[0].legend(fontsize=8)
    rows = s.get("engine", {}).get("rows", [])
    if rows:
        x = range(len(rows))
        axes[1].bar([i - 0.2 for i in x], [r["vendor_median_ms"] for r in rows], 0.4, label="vendor_graph.cuda")
        axes[1].bar([i + 0.2 for i in x], [r["lmdeploy_median_ms"] for r in rows], 0.4, label="lmdeploy graph")
        axes[1].set_xticks(list(x), [str(r["batch"]) for r in rows])
        axes[1].set(xlabel="batch", ylabel="ms per output token (median)", title="lmdeploy engine TPOT")
        axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main(argv=None) -> int:
    folder = Path((argv or sys.argv[1:] or [DEFAULT])[0])
    s = summarise(folder)
    (folder / "summary.json").write_text(json.dumps(s, indent=1) + "\n")
    (folder / "summary.md").write_text(markdown(s))
    made = plot(s, folder / "h200.png")
    print(markdown(s))
    print("plot:", folder / "h200.png" if made else "skipped (matplotlib not importable)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
