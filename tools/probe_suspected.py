"""Probe, on a real Ascend NPU, the torch_npu behaviours vendor_graph's simulator only suspects.

The simulator (``vendor_graph_sim.device``) models two behaviours that were read from torch_npu's
Python source but never observed on hardware:

1. ``g2a_plain_name_noop``: on the G2a releases (2.1.0.post13, 2.5.1.post1, 2.6.0) the dispatcher of
   ``NPUGraph`` intercepts ``npu_fused_infer_attention_score`` only under its bare and ``.out`` names,
   so a call through ``torch.ops.npu.npu_fused_infer_attention_score`` (which dispatches as
   ``.default``) is never recorded and ``NPUGraph.update()`` silently does nothing. The probe captures
   one FIA decode call each way with ``auto_dispatch_capture=True``, counts the records, updates the
   KV lengths and compares each replay with an eager call at the new lengths.
2. ``external_event_blocks``: a task captured behind ``ExternalEvent.wait(stream)`` +
   ``reset(stream)`` does not run on replay until the event is recorded (the task-update path relies
   on this). The probe replays such a graph, checks it has not finished after a wait, records the
   event from another stream and checks it then finishes.

Prints one JSON object (the verdict of each probe: confirmed / refuted / not-applicable / error, with
details) and exits 0 when every probe ran, 1 when one errored, 2 when torch_npu (or an NPU) is absent.
This script has never run on hardware; the hardware workflow (.github/workflows/ascend.yml) runs it.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from typing import Any


def _absent(message: str) -> int:
    print(json.dumps({"error": message}))
    print(f"probe_suspected: {message}", file=sys.stderr)
    return 2


def _generation(version: str | None) -> str | None:
    try:
        from vendor_graph.vendors.ascend import releases

        return releases.generation_of(version) if version else None
    except Exception:  # noqa: BLE001 - the probe reports, it does not depend on the table
        return None


def probe_plain_name_noop(torch: Any, npu: Any) -> dict[str, Any]:
    if not (hasattr(npu, "NPUGraph") and hasattr(npu.NPUGraph, "update")):
        return {"verdict": "not-applicable", "details": "this torch_npu has no NPUGraph.update"}
    batch, heads, dim, blocks = 2, 4, 64, 32
    q = torch.randn(batch, 1, heads * dim, dtype=torch.float16, device="npu")
    k = torch.randn(batch, blocks, heads * dim, dtype=torch.float16, device="npu")
    v = torch.randn(batch, blocks, heads * dim, dtype=torch.float16, device="npu")
    captured_lens, new_lens = [blocks, blocks], [5, 9]
    kwargs = {"num_heads": heads, "input_layout": "BSH", "scale": dim ** -0.5}
    results: dict[str, Any] = {}
    for spelling in ("default", "out"):
        op = torch.ops.npu.npu_fused_infer_attention_score
        graph = npu.NPUGraph()
        out = lse = None
        if spelling == "out":
            out = torch.empty_like(q)
            lse = torch.empty(batch, heads, 1, 1, dtype=torch.float32, device="npu")
        npu.synchronize()
        with npu.graph(graph, auto_dispatch_capture=True):
            if spelling == "default":
                captured = op(q, k, v, actual_seq_lengths_kv=captured_lens, **kwargs)[0]
            else:
                op.out(q, k, v, actual_seq_lengths_kv=captured_lens, **kwargs, workspace=None,
                       out=[out, lse])
                captured = out
        mode = getattr(graph, "graph_dispatch_mode", None)
        records = len(getattr(mode, "graph_dispatch_records", []) or [])
        graph.update(cpu_update_input=[{"actual_seq_lengths_kv": new_lens}])
        graph.replay()
        npu.synchronize()
        eager_new = op(q, k, v, actual_seq_lengths_kv=new_lens, **kwargs)[0]
        eager_old = op(q, k, v, actual_seq_lengths_kv=captured_lens, **kwargs)[0]
        results[spelling] = {
            "records": records,
            "replay_matches_updated_lengths": bool(torch.allclose(captured, eager_new, atol=1e-2, rtol=1e-2)),
            "replay_matches_captured_lengths": bool(torch.allclose(captured, eager_old, atol=1e-2, rtol=1e-2)),
        }
    default = results["default"]
    noop = default["records"] == 0 and default["replay_matches_captured_lengths"]
    return {"verdict": "confirmed" if noop else "refuted", "details": results}


def probe_external_event_blocks(torch: Any, npu: Any) -> dict[str, Any]:
    if not all(hasattr(npu, n) for n in ("NPUGraph", "ExternalEvent", "graph_task_group_begin")):
        return {"verdict": "not-applicable", "details": "this torch_npu has no ExternalEvent / task groups"}
    x = torch.zeros(1024, device="npu")
    stream = npu.Stream()
    other = npu.Stream()
    event = npu.ExternalEvent()
    graph = npu.NPUGraph()
    npu.synchronize()
    with npu.graph(graph, stream=stream):
        event.wait(stream)
        event.reset(stream)
        npu.graph_task_group_begin(stream)
        x.add_(1)
        npu.graph_task_group_end(stream)
    with npu.stream(stream):
        graph.replay()
        done = npu.Event()
        done.record(stream)
    time.sleep(2.0)
    finished_before_record = bool(done.query())
    event.record(other)  # releases the replay (also when it did not block)
    deadline = time.monotonic() + 30
    while not done.query() and time.monotonic() < deadline:
        time.sleep(0.05)
    finished_after_record = bool(done.query())
    value = float(x[0].item()) if finished_after_record else None
    details = {"finished_before_record": finished_before_record, "finished_after_record": finished_after_record,
               "x_after": value}
    if not finished_after_record:
        return {"verdict": "error", "details": {**details, "why": "replay still blocked 30 s after event.record"}}
    return {"verdict": "refuted" if finished_before_record else "confirmed", "details": details}


PROBES = {"g2a_plain_name_noop": probe_plain_name_noop, "external_event_blocks": probe_external_event_blocks}


def main() -> int:
    try:
        import torch
        import torch_npu  # noqa: F401  (registers torch.npu)
    except ImportError as exc:
        return _absent(f"torch_npu is not importable ({exc}); run this on an Ascend machine with CANN and "
                       f"torch_npu installed")
    npu = torch.npu
    if not npu.is_available():
        return _absent("torch_npu is installed but no NPU is available")
    version = getattr(torch_npu, "__version__", None)
    report: dict[str, Any] = {"torch": torch.__version__, "torch_npu": version, "generation": _generation(version),
                              "probes": {}}
    status = 0
    for name, probe in PROBES.items():
        try:
            report["probes"][name] = probe(torch, npu)
        except Exception as exc:  # noqa: BLE001 - each probe's failure is part of the verdict
            report["probes"][name] = {"verdict": "error", "details": f"{type(exc).__name__}: {exc}",
                                      "traceback": traceback.format_exc()[-2000:]}
            status = 1
    print(json.dumps(report, indent=2, sort_keys=True))
    return status


if __name__ == "__main__":
    sys.exit(main())
