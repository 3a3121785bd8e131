"""Report of ``benchmarks/h200.sh part4`` (``capacity_engine.py``): graphs sized to the workload and to the
memory. Reads the results folder (``results_part4.tgz`` unpacked) and writes ``capacity.json`` and
``capacity.md`` into ``--out-dir`` (default ``benchmarks/results/``).

    python benchmarks/report_capacity.py RESULTS_DIR [--out-dir DIR]

(a) Per round, default sizes vs the sizes fitted to round 1's histogram (``plan.json``): padded fraction of
the measured workload, graphs, decode throughput and TPOT ratios fitted / default (median and min-max over
rounds), greedy tokens equal or the mismatches (with the same-mode run-to-run baseline), the goal "padded
tokens <= 10% with no more graphs than the default" computed per round, the plan checked against an
independent optimum, and whether ``VENDOR_GRAPH_PLAN=auto`` (``auto_r1``) captured the plan's sizes.
(b) The oom configuration without and with the graph-memory reservation (and under lmdeploy's own graph
mode): engine built, capture failures, eager steps, workload completed, KV blocks, bytes reserved.
Inputs with ``"fake": true`` (``h200.sh dry4``) give a report labelled as a dry run.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import capacity_engine as ce  # noqa: E402
from _stats import spread  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = Path(__file__).parent / "results"
GOAL_PADDED = 0.10  # padded tokens / graph tokens of the measured workload, fitted sizes
NAME = "capacity"


def load(folder: Path, name: str):
    path = folder / name
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        return {"unreadable": f"{name}: {exc}"}


def rounds_in(folder: Path) -> list[int]:
    found = set()
    for path in folder.glob("*_r*.json"):
        m = re.fullmatch(r"(default|fitted)_r(\d+)\.json", path.name)
        if m:
            found.add(int(m.group(2)))
    return sorted(found)


def run_summary(doc: dict | None) -> dict | None:
    if not doc:
        return None
    vg = doc.get("vendor_graph") or {}
    w = doc.get("workload") or {}
    work = vg.get("workload") or {}
    return {
        "label": doc.get("label"), "stage": doc.get("stage"), "engine_built": doc.get("engine_built"),
        "completed": w.get("completed"), "requests_complete": w.get("requests_complete"),
        "requests": w.get("requests"), "decode_tok_s": w.get("decode_tok_s"), "tpot_ms": w.get("tpot_ms"),
        "ttft_median_ms": w.get("ttft_median_ms"), "wall_s": w.get("wall_s"),
        "capture_sizes": vg.get("capture_sizes"), "graphs": vg.get("graphs"),
        "graphs_captured": vg.get("graphs_captured"), "never_replayed": vg.get("never_replayed"),
        "padded_fraction": work.get("padded_fraction"), "real_tokens": work.get("real_tokens"),
        "graph_tokens": work.get("graph_tokens"), "eager_steps": work.get("eager_steps"),
        "capture_failures": vg.get("capture_failures"), "engine_build_s": doc.get("engine_build_s"),
        "kv_blocks": (doc.get("engine") or {}).get("kv_blocks"),
        "capture_source": ((((vg.get("runners") or [{}])[0]).get("capture_plan")) or {}).get("source"),
    }


def compare_tokens(a: dict | None, b: dict | None) -> dict | None:
    """Per request: equal greedy tokens, or where they first differ."""
    if not a or not b or "tokens" not in a or "tokens" not in b:
        return None
    ta, tb = a["tokens"], b["tokens"]
    mismatched = {}
    for i, (x, y) in enumerate(zip(ta, tb, strict=False)):
        if x != y:
            first = next((k for k, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
            mismatched[str(i)] = {"first_diff_at": first, "lengths": [len(x), len(y)]}
    n = min(len(ta), len(tb))
    return {"requests": n, "equal": n - len(mismatched), "all_equal": not mismatched and len(ta) == len(tb),
            "mismatched": mismatched}


def _ratio(a, b):
    return a / b if a is not None and b else None


def _spread(values: list) -> dict | None:
    vals = [v for v in values if v is not None]
    return spread(vals) if vals else None


def _merged(docs: list) -> dict | None:
    """The stats documents the plan was fitted to, their histograms summed (None when one is missing)."""
    if not docs or any(d is None for d in docs):
        return None
    hist: dict[str, int] = {}
    for d in docs:
        for b, n in (d.get("batch_histogram") or {}).items():
            hist[b] = hist.get(b, 0) + int(n)
    return {**docs[0], "batch_histogram": hist}


def section_a(folder: Path) -> dict:
    out: dict = {"rounds": [], "goal_padded_max": GOAL_PADDED}
    docs = {}
    for r in rounds_in(folder):
        docs[r] = (load(folder, f"default_r{r}.json"), load(folder, f"fitted_r{r}.json"))
    for r, (d, f) in docs.items():
        sd, sf = run_summary(d), run_summary(f)
        row: dict = {"round": r, "order": "default first" if r % 2 else "fitted first", "default": sd, "fitted": sf}
        if sd and sf:
            row["decode_tok_s_ratio"] = _ratio(sf["decode_tok_s"], sd["decode_tok_s"])
            row["tpot_ratio"] = _ratio(sf["tpot_ms"], sd["tpot_ms"])
            row["wall_ratio"] = _ratio(sf["wall_s"], sd["wall_s"])
            row["tokens"] = compare_tokens(d, f)
            pf, gd, gf = sf["padded_fraction"], sd["graphs"], sf["graphs"]
            if pf is not None and gd is not None and gf is not None:
                row["goal"] = {"padded_fraction": pf, "graphs": gf, "default_graphs": gd,
                               "met": pf <= GOAL_PADDED and gf <= gd}
        out["rounds"].append(row)
    paired = [row for row in out["rounds"] if "decode_tok_s_ratio" in row]
    out["decode_tok_s_ratio"] = _spread([row["decode_tok_s_ratio"] for row in paired])
    out["tpot_ratio"] = _spread([row["tpot_ratio"] for row in paired])
    out["padded_fraction_default"] = _spread([row["default"]["padded_fraction"] for row in paired])
    out["padded_fraction_fitted"] = _spread([row["fitted"]["padded_fraction"] for row in paired])
    goals = [row["goal"] for row in paired if "goal" in row]
    out["goal"] = {"rounds": len(goals), "met_rounds": sum(g["met"] for g in goals),
                   "status": ("PASS" if all(g["met"] for g in goals) else "MISS") if goals else "NO DATA",
                   "rule": f"every round: fitted padded fraction <= {GOAL_PADDED:.0%} and fitted graphs <= default"}
    # greedy tokens: default vs fitted per round, and the same mode across runs (run-to-run baseline)
    base = {}
    for mode, k in (("default", 0), ("fitted", 1)):
        first = docs.get(1, (None, None))[k]
        for r, pair in docs.items():
            if r != 1:
                cmp = compare_tokens(first, pair[k])
                if cmp:
                    base[f"{mode}_r1 vs {mode}_r{r}"] = cmp
    out["token_baselines"] = base
    # the plan, checked against capacity_engine's independent optimum on round 1's histogram
    plan = load(folder, "plan.json")
    sources = [Path(f).name for f in (plan or {}).get("files") or []] or ["stats_default_r1.json"]
    stats = _merged([load(folder, name) for name in sources])
    if plan:
        info: dict = {"capture_sizes": plan.get("capture_sizes"), "fallback": bool(plan.get("fallback")),
                      "padded_fraction_before": plan.get("padded_fraction_before"),
                      "padded_fraction_after": plan.get("padded_fraction_after"), "max_graphs": plan.get("max_graphs")}
        if stats and stats.get("batch_histogram") and plan.get("capture_sizes"):
            hist = {int(b): int(n) for b, n in stats["batch_histogram"].items()}
            graphs = plan.get("max_graphs") or len(stats.get("capture_sizes") or ce.DEFAULT_SIZES_64)
            best = ce.best_sizes(hist, int(stats.get("max_batches") or ce.MAX_BATCH), int(graphs))
            mine, theirs = ce.padding(hist, best), ce.padding(hist, plan["capture_sizes"])
            info["independent"] = {"capture_sizes": best, "padded_tokens": mine["padded_tokens"],
                                   "padded_fraction": mine["padded_fraction"],
                                   "plan_padded_tokens": theirs["padded_tokens"],
                                   "plan_is_optimal": theirs["padded_tokens"] <= mine["padded_tokens"]
                                   and len(plan["capture_sizes"]) <= graphs,
                                   "recorded_sizes": stats.get("capture_sizes"),
                                   "recorded_padded_fraction": ce.padding(hist, stats.get("capture_sizes")
                                                                          or ce.DEFAULT_SIZES_64)["padded_fraction"],
                                   "histogram_steps": sum(hist.values()), "distinct_batches": len(hist),
                                   "max_batch_seen": max(hist) if hist else None}
        info["fitted_to"] = sources
        out["plan"] = info
    auto = load(folder, "auto_r1.json")
    if auto:
        sa = run_summary(auto)
        sizes = sa["capture_sizes"]
        want = sorted(plan["capture_sizes"]) if plan and plan.get("capture_sizes") else None
        doc = ((auto.get("stats_file") or {}).get("document")) or {}
        out["auto_r1"] = {"capture_sizes": sizes, "plan_sizes": want, "capture_source": sa["capture_source"],
                          "engine_built": auto.get("engine_built"),
                          "reserved_graph_memory_bytes": doc.get("reserved_graph_memory_bytes"),
                          "equal": (sorted(sizes) == want) if sizes and want else None,
                          "status": ("PASS" if sizes and want and sorted(sizes) == want else "MISS")
                          if want else "NO PLAN"}
    return out


def _oom_row(doc: dict | None) -> dict | None:
    if not doc:
        return None
    vg = doc.get("vendor_graph") or {}
    w = doc.get("workload") or {}
    stats_doc = ((doc.get("stats_file") or {}).get("document")) or {}
    plan = (((vg.get("runners") or [{}])[0]).get("capture_plan")) or {}
    reserved = stats_doc.get("reserved_graph_memory_bytes")
    if reserved is None:
        reserved = plan.get("reserved_bytes")
    reasons = sorted({str(v)[:240] for v in (vg.get("eager_reasons") or {}).values()})
    eager_total = {}
    for runner in vg.get("runners") or []:
        for k, v in (runner.get("eager_steps_total") or {}).items():
            eager_total[k] = eager_total.get(k, 0) + v
    text = " ".join([str(doc.get("engine_error") or ""), str(doc.get("traceback_tail") or "")] + reasons).lower()
    return {
        "label": doc.get("label"), "graph_mode": doc.get("graph_mode"), "config": doc.get("config"),
        "env": doc.get("env"), "engine_built": doc.get("engine_built"), "stage": doc.get("stage"),
        "engine_error": doc.get("engine_error"), "traceback_tail": (doc.get("traceback_tail") or "")[-1500:] or None,
        "capture_sizes": vg.get("capture_sizes"), "graphs_captured": vg.get("graphs_captured"),
        "capture_failures": vg.get("capture_failures"), "failed_sizes": vg.get("failed_sizes"),
        "failure_reasons": reasons, "eager_steps_workload": (vg.get("workload") or {}).get("eager_steps"),
        "eager_steps_total": eager_total, "workload_completed": w.get("completed"),
        "workload_tokens": w.get("output_tokens"), "kv_blocks": (doc.get("engine") or {}).get("kv_blocks"),
        "reserved_bytes": reserved, "graph_memory_env": (doc.get("env") or {}).get("VENDOR_GRAPH_GRAPH_MEMORY"),
        "free_after_start": (doc.get("memory_after_start") or {}).get("free_bytes"),
        "reserved_after_start": (doc.get("memory_after_start") or {}).get("memory_reserved"),
        "mentions_out_of_memory": "out of memory" in text or "outofmemory" in text,
    }


def section_b(folder: Path) -> dict:
    off, on, own = (_oom_row(load(folder, f"oom_{n}.json")) for n in ("off", "reserved", "lmdeploy_own"))
    out: dict = {"off": off, "reserved": on, "lmdeploy_own": own}
    config = next((r["config"] for r in (off, on, own) if r and r.get("config")), None)
    out["config"] = config
    if off and on:
        off_failed = (off["engine_built"] is False) or bool(off["capture_failures"])
        on_served = bool(on["engine_built"]) and not on["capture_failures"] and bool(on["workload_completed"])
        out["outcome"] = {
            "without_reservation_failed": off_failed, "failure_mentions_out_of_memory": off["mentions_out_of_memory"],
            "with_reservation_served": on_served,
            "kv_blocks_given_up": (off["kv_blocks"] - on["kv_blocks"]) if off["kv_blocks"] and on["kv_blocks"]
            else None,
            "status": "SHOWN" if off_failed and on_served else "NOT SHOWN",
            "rule": "without: capture failures (or no engine); with: engine built, 0 capture failures, workload done"}
    return out


def _fmt(v, spec: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if spec == "%":
        return f"{v:.1%}"
    if spec == "MiB":
        return f"{v / 2**20:.1f} MiB"
    if isinstance(v, float):
        return f"{v:{spec or '.3f'}}"
    return str(v)


def _sp(s: dict | None, spec: str = ".3f") -> str:
    if not s:
        return "-"
    return f"{s['median']:{spec}} (min {s['min']:{spec}}, max {s['max']:{spec}}, n={s['n']})"


def markdown(rep: dict) -> list[str]:
    a, b = rep["a"], rep["b"]
    lines = []
    title = "# Graphs sized to the workload and the memory (H200, lmdeploy 0.18, vendor_graph.cuda)"
    if rep["dry_run"]:
        title = "# DRY RUN (made-up inputs, not measurements): graphs sized to the workload and the memory"
    lines += [title, ""]
    if rep["dry_run"]:
        lines += ["**Dry run**: every figure below comes from `capacity_engine.py fake`; nothing was measured.", ""]
    wc = rep.get("workload_constants") or {}
    if wc:
        lines += [f"Workload: {wc.get('requests')} requests, seed {wc.get('seed')}, waves (offset s, requests) "
                  f"{wc.get('waves')}, {wc.get('wave_gap_s', 0) * 1e3:.0f} ms apart in a wave, prompts "
                  f"{wc.get('prompt_len')} and outputs {wc.get('output_len')} tokens ({wc.get('distribution')}), "
                  f"greedy, ignore_eos; {rep.get('model_params')} parameter random Llama (GQA 12/2 heads).", ""]
    lines += ["## (a) Capture sizes fitted to the recorded histogram", ""]
    plan = a.get("plan")
    if plan:
        ind = plan.get("independent") or {}
        lines += [f"Plan (`vendor-graph plan --from-stats {' '.join(plan.get('fitted_to') or [])} --json`"
                  f"{', FALLBACK: capacity_engine optimum' if plan['fallback'] else ''}): sizes "
                  f"{plan['capture_sizes']}; predicted padded {_fmt(plan['padded_fraction_before'], '%')} -> "
                  f"{_fmt(plan['padded_fraction_after'], '%')}. Independent optimum with {plan.get('max_graphs')} "
                  f"graphs: {ind.get('capture_sizes')} ({_fmt(ind.get('padded_fraction'), '%')}); plan optimal: "
                  f"{_fmt(ind.get('plan_is_optimal'))}. Fitted histogram: {ind.get('histogram_steps')} decode steps, "
                  f"{ind.get('distinct_batches')} distinct batches, largest {ind.get('max_batch_seen')}.", ""]
    lines += ["| round | order | padded default | padded fitted | graphs d/f | decode tok/s d / f | ratio f/d "
              "| TPOT ms d / f | ratio f/d | tokens equal | goal |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in a["rounds"]:
        d, f = row["default"] or {}, row["fitted"] or {}
        tok = row.get("tokens")
        goal = row.get("goal")
        equal = f"{tok['equal']}/{tok['requests']}" if tok else "-"
        lines.append(
            f"| {row['round']} | {row['order']} | {_fmt(d.get('padded_fraction'), '%')} | "
            f"{_fmt(f.get('padded_fraction'), '%')} | {_fmt(d.get('graphs'))}/{_fmt(f.get('graphs'))} | "
            f"{_fmt(d.get('decode_tok_s'), '.0f')} / {_fmt(f.get('decode_tok_s'), '.0f')} | "
            f"{_fmt(row.get('decode_tok_s_ratio'))} | {_fmt(d.get('tpot_ms'), '.3f')} / "
            f"{_fmt(f.get('tpot_ms'), '.3f')} | {_fmt(row.get('tpot_ratio'))} | {equal} | "
            f"{('PASS' if goal['met'] else 'MISS') if goal else '-'} |")
    lines += ["", f"- decode throughput fitted/default: {_sp(a['decode_tok_s_ratio'])}",
              f"- TPOT fitted/default: {_sp(a['tpot_ratio'])}",
              f"- padded fraction default: {_sp(a['padded_fraction_default'], '.1%')}; fitted: "
              f"{_sp(a['padded_fraction_fitted'], '.1%')}",
              f"- goal ({a['goal']['rule']}): **{a['goal']['status']}** "
              f"({a['goal']['met_rounds']}/{a['goal']['rounds']} rounds)"]
    for row in a["rounds"]:
        f = row["fitted"] or {}
        d = row["default"] or {}
        lines.append(f"- round {row['round']}: fitted sizes {f.get('capture_sizes')} (never replayed "
                     f"{f.get('never_replayed')}), default never replayed {d.get('never_replayed')}; eager steps "
                     f"d {d.get('eager_steps') or {}} f {f.get('eager_steps') or {}}")
        tok = row.get("tokens")
        if tok and not tok["all_equal"]:
            shown = dict(list(tok["mismatched"].items())[:8])
            lines.append(f"  - greedy tokens differ in {len(tok['mismatched'])} requests (first at token: {shown})")
    for name, cmp in a["token_baselines"].items():
        lines.append(f"- run-to-run baseline {name}: {cmp['equal']}/{cmp['requests']} requests equal")
    auto = a.get("auto_r1")
    if auto:
        lines.append(f"- `VENDOR_GRAPH_PLAN=auto` (auto_r1): sizes {auto['capture_sizes']} (source "
                     f"{auto['capture_source']}) vs plan.json {auto['plan_sizes']}: **{auto['status']}**; reserved "
                     f"{_fmt(auto['reserved_graph_memory_bytes'], 'MiB')} (graph memory auto)")
    lines += ["", "## (b) Graph memory kept out of the KV cache", ""]
    cfg = b.get("config") or {}
    lines += [f"Configuration: max_batch_size {cfg.get('max_batch_size')}, cache_max_entry_count "
              f"{cfg.get('cache_max_entry_count')}, max_prefill_token_num {cfg.get('max_prefill_token_num')}, "
              f"session_len {cfg.get('session_len')}; short workload {ce.SHORT_REQUESTS} x {ce.SHORT_TOKENS} tokens.",
              ""]
    cols = [("off", "VENDOR_GRAPH_GRAPH_MEMORY=off"), ("reserved", "VENDOR_GRAPH_GRAPH_MEMORY=auto"),
            ("lmdeploy_own", "lmdeploy's own")]
    present = [(k, t) for k, t in cols if b.get(k)]
    if present:
        lines += ["| | " + " | ".join(t for _, t in present) + " |", "|---|" + "---|" * len(present)]
        fields = [("stage reached", "stage", ""), ("engine built", "engine_built", ""),
                  ("graphs captured", "graphs_captured", ""),
                  ("capture failures", "capture_failures", ""), ("failed sizes", "failed_sizes", ""),
                  ("eager steps (workload)", "eager_steps_workload", ""),
                  ("workload completed", "workload_completed", ""), ("KV blocks", "kv_blocks", ""),
                  ("reserved", "reserved_bytes", "MiB"), ("free after start", "free_after_start", "MiB"),
                  ("mentions out of memory", "mentions_out_of_memory", "")]
        for label, key, spec in fields:
            lines.append(f"| {label} | " + " | ".join(_fmt(b[k].get(key), spec) for k, _ in present) + " |")
        lines.append("")
        for k, t in present:
            row = b[k]
            if row.get("failure_reasons"):
                lines.append(f"- {t}: capture failure reasons: {row['failure_reasons'][:3]}")
            if row.get("engine_error"):
                lines.append(f"- {t}: engine construction failed: `{row['engine_error'][:300]}`")
    out = b.get("outcome")
    if out:
        lines += ["", f"Outcome ({out['rule']}): **{out['status']}** (without: failed "
                  f"{_fmt(out['without_reservation_failed'])}, "
                  f"out of memory named {_fmt(out['failure_mentions_out_of_memory'])}; with: served "
                  f"{_fmt(out['with_reservation_served'])}; KV blocks given up {_fmt(out['kv_blocks_given_up'])})"]
    if rep.get("steps"):
        lines += ["", "## Steps", "", "```", *rep["steps"], "```"]
    return lines


def report(folder: Path) -> dict:
    docs = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json")) if p.name != "plan.json"]
    docs = [d for d in docs if isinstance(d, dict)]
    dry = any(d.get("fake") or d.get("dry_run") for d in docs)
    first = next((d for d in docs if d.get("workload_constants")), {})
    steps = next(iter(sorted(folder.glob("steps_part4*.txt"))), folder / "steps_part4.txt")
    where = folder.resolve()
    shown = where.relative_to(ROOT) if where.is_relative_to(ROOT) else where
    return {"dry_run": dry, "results_dir": str(shown), "workload_constants": first.get("workload_constants"),
            "model_params": (first.get("model") or {}).get("params"), "a": section_a(folder), "b": section_b(folder),
            "steps": steps.read_text().splitlines() if steps.exists() else None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path)
    p.add_argument("--out-dir", type=Path, default=DEFAULT_OUT)
    p.add_argument("--name", default=NAME, help=f"file name of the report (default {NAME})")
    args = p.parse_args(argv)
    rep = report(args.results)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"{args.name}.json").write_text(json.dumps(rep, indent=2) + "\n")
    (args.out_dir / f"{args.name}.md").write_text("\n".join(markdown(rep)) + "\n")
    a, b = rep["a"], rep["b"]
    print(f"{'DRY RUN: ' if rep['dry_run'] else ''}goal {a['goal']['status']}; throughput ratio "
          f"{_sp(a['decode_tok_s_ratio'])}; auto {(a.get('auto_r1') or {}).get('status')}; oom "
          f"{(b.get('outcome') or {}).get('status')}; wrote {args.out_dir / args.name}.{{json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
