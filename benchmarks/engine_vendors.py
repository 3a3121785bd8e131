"""Camb's and MACA's code paths through lmdeploy's engine on an NVIDIA GPU, with real CUDA graphs.

``python benchmarks/engine_vendors.py VENDOR OUT.json`` (VENDOR ``maca`` or ``camb``), on a CUDA machine with
lmdeploy and ``VENDOR_GRAPH_DLINFER_SRC`` (a dlinfer source tree): the user's script of
:mod:`vendor_graph_sim.engine` (``import vendor_graph.<vendor>``, then ``pipeline(device_type=<vendor>)``, graph mode
against ``eager_mode=True``, greedy), with lmdeploy's own ``<Vendor>OpsBackend`` (its ``update_step_context`` and
``build_graph_runner``: lmdeploy's ``CUDAGraphRunner``, adopted by vendor_graph, capturing ``torch.cuda.CUDAGraph``)
over the real dlinfer laid out as ``DEVICE=<vendor>`` builds it (:func:`vendor_graph_sim.boot.serve_vendor`).

What no NVIDIA machine has is a labelled stand-in running on the GPU: for MACA ``flash_attn`` and ``mcoplib``
(dlinfer's own Triton kernels run for real where triton is installed); for Camb ``torch_mlu_ops``, and a
``torch_mlu`` whose GPU migration runs the other way (``mlu`` means ``cuda``,
:func:`vendor_graph_sim.device._cuda_style.install_torch_mlu_on_cuda`). MACA's torch is a CUDA build, so its path is
the code a MetaX user runs, kernels aside; Camb's is its lmdeploy backend and dlinfer package on CUDA's graph API
(torch_mlu's ``MLUGraph`` mirrors it).

Workload (fixed here, before any run): the engine demo's checkpoints (``lmdeploy-llama``, ``lmdeploy-mixtral``:
a routed MoE in each layer; on MACA also ``lmdeploy-mla`` with prompts of one length, which its MLA prefill needs),
seed 0, 10 requests at ``max_batch_size`` 6 (queueing, joining, leaving: the batch crosses the graph sizes), cases
``basic`` (fixed cache) and ``prefix-auto`` (prefix caching over a cache sized from free memory). Verdict per pair:
greedy tokens equal, vendor_graph's runner replayed graphs, every decode step captured or replayed. The wall times
are one run's, kept for context: the model is tiny, and they are not a speed claim.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
import traceback
from pathlib import Path

MODELS = {"maca": [("lmdeploy-llama", ("basic", "prefix-auto")), ("lmdeploy-mixtral", ("basic", "prefix-auto")),
                   ("lmdeploy-mla", ("equal-prompts",))],
          "camb": [("lmdeploy-llama", ("basic", "prefix-auto")), ("lmdeploy-mixtral", ("basic", "prefix-auto"))]}
SEED = 0


def verdict(graph: dict, eager: dict, equal: bool) -> list[str]:
    """What is wrong with a pair (empty: it passed)."""
    problems = []
    if not equal:
        problems.append("graph tokens differ from eager's")
    if not graph["runner"].startswith("vendor_graph."):
        problems.append(f"lmdeploy built {graph['runner'] or 'no'} runner, not vendor_graph's")
    if not graph["replays"]:
        problems.append("no graph replayed")
    decode = sum(graph["histogram"].values())
    if decode != graph["captures"] + graph["replays"]:
        problems.append(f"{decode} decode steps, {graph['captures']} captures + {graph['replays']} replays")
    if eager["captures"] or eager["replays"]:
        problems.append("the eager run used graphs")
    return problems


def report(folder: Path) -> str:
    """``summary.md`` of the ``engine_<vendor>.json`` files in ``folder``: one row per pair."""
    lines = ["# Camb and MACA through lmdeploy's engine on an H200 (real CUDA graphs)", "",
             "Written by `python benchmarks/engine_vendors.py report " + folder.as_posix() + "` from the JSON files "
             "beside it (each names the command that made it). Wall times: one run each, tiny model, context only.",
             "", "| vendor | model | case | tokens equal | captures | replays | graph s | eager s | verdict |",
             "|---|---|---|---|---:|---:|---:|---:|---|"]
    notes = []
    for path in sorted(folder.glob("engine_*.json")):
        record = json.loads(path.read_text())
        notes.append(f"- {record['vendor']}: `{record['command']}`; lmdeploy {record['lmdeploy']}, torch "
                     f"{record['torch']}, triton {record['triton']}, {record['gpu']}; stand-ins: "
                     f"{', '.join(record['standins']) or 'none'}; bridges: {', '.join(record['bridges']) or 'none'}")
        for r in record["results"]:
            graph, eager = r.get("graph") or {}, r.get("eager") or {}
            lines.append(f"| {record['vendor']} | {r['model']} | {r['case']} | {r.get('tokens_equal', '-')} | "
                         f"{graph.get('captures', '-')} | {graph.get('replays', '-')} | {graph.get('seconds', '-')} | "
                         f"{eager.get('seconds', '-')} | {'; '.join(r['problems']) or 'PASS'} |")
    return "\n".join(lines + ["", *notes, ""])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["report"]:
        folder = Path(argv[1])
        (folder / "summary.md").write_text(report(folder))
        return 0
    parser = argparse.ArgumentParser(prog="engine_vendors.py", epilog="or: engine_vendors.py report FOLDER")
    parser.add_argument("vendor", choices=sorted(MODELS))
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)

    from vendor_graph_sim import boot

    boot.serve_vendor(args.vendor)
    if args.vendor == "camb":
        # accelerate, which transformers imports, takes an importable torch_mlu for an MLU machine and fails on this
        # one: imported before torch_mlu exists
        import transformers.generation.utils  # noqa: F401
        from vendor_graph_sim.device import _cuda_style

        _cuda_style.install_torch_mlu_on_cuda()
    import importlib

    importlib.import_module(f"vendor_graph.{args.vendor}")  # the user's first line
    import lmdeploy
    import torch
    from vendor_graph_sim import engine

    from vendor_graph.install import bridges

    results = []
    for model, cases in MODELS[args.vendor]:
        for case in cases:
            entry = {"model": model, "case": case}
            start = time.perf_counter()
            try:
                pair = engine.compare(model, seed=SEED, **engine.CASES[case])
                graph, eager = dataclasses.asdict(pair.graph), dataclasses.asdict(pair.eager)
                entry.update(tokens_equal=pair.tokens_equal, first_difference=pair.first_difference(),
                             problems=verdict(graph, eager, pair.tokens_equal), graph=graph, eager=eager)
            except Exception as exc:  # noqa: BLE001 - recorded: what this stack does is the finding
                entry.update(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-4000:],
                             problems=["raised"])
            entry["seconds"] = round(time.perf_counter() - start, 1)
            results.append(entry)
            print(f"{args.vendor} {model} {case}: {entry.get('problems') or 'PASS'}", flush=True)
    standins = sorted(name for name, module in list(sys.modules.items())
                      if boot.STANDIN_LABEL in getattr(module, "__dict__", {}))
    triton = sys.modules.get("triton")
    record = {
        "command": f"python benchmarks/engine_vendors.py {args.vendor} {args.out.name}",
        "vendor": args.vendor, "lmdeploy": lmdeploy.__version__, "torch": torch.__version__,
        "triton": getattr(triton, "__version__", None), "gpu": torch.cuda.get_device_name(0),
        "python": platform.python_version(), "dlinfer": getattr(sys.modules.get("dlinfer"), "__file__", None),
        "standins": standins, "bridges": sorted({b.name for b in bridges.applied()}),
        "passed": all(not r["problems"] for r in results), "results": results,
    }
    args.out.write_text(json.dumps(record, indent=1))
    return 0 if record["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
