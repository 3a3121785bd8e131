"""Faults and resets leak nothing: device memory around failed captures, reset/recapture cycles and a
weight update that drops the graphs, with serving checked against eager at every step.

    python benchmarks/graph_leaks.py --device cuda   # real CUDA graphs: Camb and MACA specs on lmdeploy's CUDA runner
    python benchmarks/graph_leaks.py --device sim    # the simulator: the same, plus Ascend (G1, G5)

Per runner configuration, 16 sequences (capture sizes 1, 2, 4, 8, 16):

* ``raise``: at each bucket, the capture raises after the model's forward was recorded into the graph's
  pool; that step is served eagerly. Allocated memory right after the step equals right before it.
* ``oom``: at each bucket, the capture runs out of memory. CUDA: a real allocator error, from asking for
  twice the GPU's memory inside the capture; the simulator: ``torch.OutOfMemoryError`` raised inside the
  capture. Allocated memory after = before.
* ``cycles``: :data:`CYCLES` times, every bucket captured and replayed, then ``runner.reset()``.
  Allocated memory after each reset equals the first cycle's; reserved memory stops growing (flat over
  the second half of the cycles; the caching allocator keeps what it reserved until ``empty_cache()``).
* ``weights``: every bucket captured; weight update with new tensors and the runner reset (lmdeploy's
  ``update_params``); recaptured. Allocated memory after the update equals that after a plain reset, and
  after recapturing equals that after the first captures.

Every step of every scenario is compared with eager (``SideBySide``: bitwise on the simulator, within
the stated tolerance on the GPU), and a scenario fails on any mismatch. On the simulator, "allocated" is
the bytes of live device tensors and "reserved" the segments of live graph pools. Writes
``benchmarks/results/graph_leaks_<device>.json`` and ``.md`` (or ``--out`` DIR).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import environment  # noqa: E402

NUM_SEQS = 16
SIZES = (1, 2, 4, 8, 16)
CYCLES = {"cuda": 100, "sim": 25}  # the simulator's capture costs ~0.1 s of CPU
SEED = 0
ALLOWED_GROWTH = 0  # bytes: allocated after == before, reserved flat after the first cycle


class InjectedFault(RuntimeError):
    pass


def configs(device: str) -> list[tuple[str, str | None]]:
    cuda_style = [("camb", None), ("maca", None)]
    return [("ascend", "G1"), ("ascend", "G5"), *cuda_style] if device == "sim" else cuda_style


PAIR_STARTS: list[int] = []  # allocated bytes as each pair begins (CUDA: cuBLAS workspaces cleared first)


@contextlib.contextmanager
def pair_for(vendor: str, generation: str | None, device: str):
    from vendor_graph_sim import harness

    if device == "cuda" and hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
        # torch keeps a cuBLAS workspace per stream it ran a GEMM on, and each pair runs on a new side stream
        torch._C._cuda_clearCublasWorkspaces()
    PAIR_STARTS.append(memory(device)[0])

    if vendor == "ascend":
        with harness.ascend_pair(generation, num_seqs=NUM_SEQS, seed=SEED) as pair:
            yield pair
    else:
        with harness.cuda_style_pair(vendor, device, num_seqs=NUM_SEQS, seed=SEED) as pair:
            yield pair


def memory(device: str) -> tuple[int, int]:
    """(allocated, reserved) bytes, after a sync and a garbage collection."""
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    from vendor_graph_sim import device as sim
    from vendor_graph_sim.device import _runtime

    storages = {}  # device tensors outside graph pools, by storage
    with warnings.catch_warnings():  # isinstance on every object touches deprecated module attributes
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            if isinstance(obj, torch.Tensor) and sim.is_device_tensor(obj) and obj._alloc is None:
                storage = obj._inner.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
    pools = {id(p): p for p in list(_runtime._POOLS.values()) + list(_runtime._PENDING_POOLS.values())}
    allocated = sum(storages.values()) + sum(p.allocated_bytes for p in pools.values())
    return allocated, sum(p.reserved_bytes for p in pools.values())


def capturing(vendor: str) -> bool:
    if vendor == "ascend":
        from vendor_graph.vendors.ascend import hook

        return hook.capturing()
    return torch.cuda.is_current_stream_capturing()


@contextlib.contextmanager
def capture_fails(pair, vendor: str, exc_factory):
    """The next capture raises ``exc_factory()`` after the model's forward was recorded (its outputs
    allocated in the graph's pool)."""
    cls = type(pair.model)
    original = cls.forward
    state = {"raised": 0}

    def forward(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if capturing(vendor) and not state["raised"]:
            state["raised"] += 1
            raise exc_factory()
        return out

    cls.forward = forward
    try:
        yield state
    finally:
        cls.forward = original


def fault(kind: str, device: str):
    """What the capture raises. ``oom`` on CUDA: a real allocator error, from asking the caching allocator
    inside the capture for twice the GPU's memory; on the simulator (no allocator limit) the error type."""
    if kind == "raise":
        return lambda: InjectedFault("injected capture fault")
    if device == "cuda":
        impossible = 2 * torch.cuda.get_device_properties(0).total_memory

        def real_oom():
            try:
                torch.empty(impossible, dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError as exc:
                return exc
            raise AssertionError("the allocator granted twice the GPU's memory")
        return real_oom
    return lambda: torch.OutOfMemoryError("injected: out of memory")


def batch(n: int) -> list[int]:
    return list(range(n))


def other_bucket(size: int) -> int:
    return 2 if size == 1 else 1


def scenario_fault(vendor, generation, device, kind: str) -> list[dict]:
    rows = []
    for size in SIZES:
        with pair_for(vendor, generation, device) as pair:
            # Measured after a replay of another bucket's graph before and after the faulty step: lmdeploy's step
            # context keeps the last step's inputs alive, so both points hold a step of the same size.
            for _ in range(2):
                pair.step(batch(other_bucket(size)))
            before = memory(device)
            error = None
            try:
                with capture_fails(pair, vendor, fault(kind, device)) as state:
                    pair.step(batch(size))
                assert state["raised"] == 1, "the fault was never raised"
            except Exception as exc:  # noqa: BLE001 - recorded: serving did not continue
                error = f"{type(exc).__name__}: {exc}"[:300]
            pair.step(batch(other_bucket(size)))
            after = memory(device)
            reasons = {k.padded_batch if hasattr(k, "padded_batch") else k: r
                       for k, r in pair.runner.eager_reasons().items()}
            went_eager = any("capture failed" in str(r) for r in reasons.values())
            for n in (size, other_bucket(size), size):  # serving goes on: the failed bucket eager, another replayed
                pair.step(batch(n))
            rows.append({"bucket": size, "allocated_before": before[0], "allocated_after": after[0],
                         "allocated_delta": after[0] - before[0], "reserved_before": before[1],
                         "reserved_after": after[1], "ran_eager_with_reason": went_eager, "error": error,
                         "mismatches": pair.mismatches[:3]})
    return rows


def scenario_cycles(vendor, generation, device) -> dict:
    cycles = CYCLES[device]
    after_reset, reserved, after_capture = [], [], []
    with pair_for(vendor, generation, device) as pair:
        baseline = memory(device)
        for _ in range(cycles):
            for n in SIZES:
                pair.step(batch(n))  # capture
            for n in SIZES:
                pair.step(batch(n))  # replay
            after_capture.append(memory(device)[0])
            pair.runner.reset()
            for slot, tokens in enumerate(pair.graph.tokens):  # long sequences finish, new ones take their blocks
                if len(tokens) > 96:
                    pair.replace(slot, [1 + (slot * 7 + i) % 250 for i in range(8)])
            alloc, res = memory(device)
            after_reset.append(alloc)
            reserved.append(res)
        graphs_left = _graph_count(pair)
        half = len(reserved) // 2
        mismatches = pair.mismatches[:3]
    return {"cycles": cycles, "allocated_baseline": baseline[0], "reserved_baseline": baseline[1],
            "allocated_after_reset_first": after_reset[0], "allocated_after_reset_last": after_reset[-1],
            "allocated_after_reset_spread": max(after_reset) - min(after_reset),
            "allocated_with_graphs_first": after_capture[0], "allocated_with_graphs_last": after_capture[-1],
            "reserved_after_first_cycle": reserved[0], "reserved_last": reserved[-1],
            "reserved_growth_after_first_cycle": reserved[-1] - reserved[0],
            "reserved_growth_second_half": max(reserved[half:]) - reserved[half],
            "reserved_by_cycle": reserved, "graphs_left_after_last_reset": graphs_left, "mismatches": mismatches}


def scenario_weights(vendor, generation, device) -> dict:
    """Every point is measured after a step of the largest batch (lmdeploy's step context holds its inputs):
    with graphs, after a reset (the graph-free reference), recaptured, after the weight update, recaptured."""
    def capture_all(pair) -> tuple[int, int]:
        for n in (*SIZES, SIZES[-1]):
            pair.step(batch(n))
        return memory(device)

    with pair_for(vendor, generation, device) as pair:
        with_graphs = capture_all(pair)
        pair.runner.reset()
        no_graphs = memory(device)
        capture_all(pair)
        pair.update_weights(moved=True)
        updated = memory(device)
        graphs_after_update = _graph_count(pair)
        recaptured = capture_all(pair)
        mismatches = pair.mismatches[:3]
    return {"allocated_with_graphs": with_graphs[0], "allocated_without_graphs": no_graphs[0],
            "allocated_after_update": updated[0], "update_delta": updated[0] - no_graphs[0],
            "graphs_after_update": graphs_after_update, "allocated_recaptured": recaptured[0],
            "recapture_delta": recaptured[0] - with_graphs[0], "reserved_with_graphs": with_graphs[1],
            "reserved_recaptured": recaptured[1], "mismatches": mismatches}


def _graph_count(pair) -> int:
    from vendor_graph_sim.harness import graphs_by_batch

    return len(graphs_by_batch(pair.runner))


def verdict(result: dict) -> list[str]:
    problems = []
    for name, r in result["configs"].items():
        for kind in ("raise", "oom"):
            for row in r[kind]:
                if row["error"] or row["mismatches"] or not row["ran_eager_with_reason"]:
                    problems.append(f"{name} {kind} bucket {row['bucket']}: served wrong or not eager: "
                                    f"{row['error'] or row['mismatches'] or 'no eager reason'}")
                if row["allocated_delta"] > ALLOWED_GROWTH:
                    problems.append(f"{name} {kind} bucket {row['bucket']}: {row['allocated_delta']} bytes kept")
        c = r["cycles"]
        if c["mismatches"] or c["graphs_left_after_last_reset"]:
            problems.append(f"{name} cycles: {c['mismatches'] or 'graphs left after reset'}")
        if max(c["allocated_after_reset_spread"], c["reserved_growth_second_half"]) > ALLOWED_GROWTH:
            problems.append(f"{name} cycles: allocated after reset varies by {c['allocated_after_reset_spread']} "
                            f"bytes, reserved grew {c['reserved_growth_second_half']} bytes over the second half")
        w = r["weights"]
        if w["mismatches"] or w["graphs_after_update"] or w["update_delta"] > ALLOWED_GROWTH \
                or w["recapture_delta"] > ALLOWED_GROWTH:
            problems.append(f"{name} weights: update kept {w['update_delta']} bytes, recapture "
                            f"{w['recapture_delta']}, graphs left {w['graphs_after_update']}, {w['mismatches']}")
    return problems


def markdown(result: dict) -> list[str]:
    mib = 1 << 20

    def m(b: int) -> str:
        return f"{b / mib:.3f}"

    lines = [f"# Faults and resets: device memory ({result['device']})", "",
             "| runner | scenario | allocated before (MiB) | after (MiB) | delta (bytes) | reserved (MiB) |",
             "|---|---|---|---|---|---|"]
    for name, r in result["configs"].items():
        for kind in ("raise", "oom"):
            for row in r[kind]:
                lines.append(f"| {name} | capture {kind} at bucket {row['bucket']} | {m(row['allocated_before'])} | "
                             f"{m(row['allocated_after'])} | {row['allocated_delta']} | "
                             f"{m(row['reserved_before'])} -> {m(row['reserved_after'])} |")
        c = r["cycles"]
        lines.append(f"| {name} | {c['cycles']} reset/recapture cycles, after each reset | "
                     f"{m(c['allocated_after_reset_first'])} (first) | {m(c['allocated_after_reset_last'])} (last) | "
                     f"{c['allocated_after_reset_spread']} (spread) | {m(c['reserved_after_first_cycle'])} -> "
                     f"{m(c['reserved_last'])}, {c['reserved_growth_second_half']} bytes over the second half |")
        w = r["weights"]
        lines.append(f"| {name} | weight update dropping the graphs (before: reset, no graphs) | "
                     f"{m(w['allocated_without_graphs'])} | {m(w['allocated_after_update'])} | {w['update_delta']} | "
                     f"{m(w['reserved_with_graphs'])} -> {m(w['reserved_recaptured'])} |")
        lines.append(f"| {name} | recaptured after the update (before: first captures) | "
                     f"{m(w['allocated_with_graphs'])} | {m(w['allocated_recaptured'])} | {w['recapture_delta']} | |")
    lines += ["", f"Verdict: {'PASS' if not result['problems'] else 'FAIL'}"]
    lines += [f"- {p}" for p in result["problems"]]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("sim", "cuda"), required=True)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    if args.device == "sim":
        from vendor_graph_sim import device as sim
        from vendor_graph_sim import standins

        standins.use_standin_dlinfer_if_missing()
        sim.install()
    torch.manual_seed(SEED)
    started = time.time()
    result = {"device": args.device, "num_seqs": NUM_SEQS, "sizes": list(SIZES), "cycles": CYCLES[args.device],
              "environment": environment(), "configs": {}}
    if args.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name(0)
    for vendor, generation in configs(args.device):
        name = vendor if generation is None else f"{vendor}/{generation}"
        result["configs"][name] = {
            "raise": scenario_fault(vendor, generation, args.device, "raise"),
            "oom": scenario_fault(vendor, generation, args.device, "oom"),
            "cycles": scenario_cycles(vendor, generation, args.device),
            "weights": scenario_weights(vendor, generation, args.device)}
        print(f"{name}: done at {time.time() - started:.0f} s", flush=True)
    result["allocated_at_pair_starts"] = PAIR_STARTS
    result["seconds"] = round(time.time() - started, 1)
    result["problems"] = verdict(result)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"graph_leaks_{args.device}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"graph_leaks_{args.device}.md").write_text("\n".join(markdown(result)) + "\n")
    print("\n".join(markdown(result)))
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
