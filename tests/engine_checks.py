"""What the engine tests on the simulated NPU share: the generations this part of the leg runs, the lmdeploy
release, vendor_graph's runner as lmdeploy names it, and the check of an eager / graph pair of
:mod:`vendor_graph_sim.engine` runs (its default workload)."""

from __future__ import annotations

import os

from vendor_graph.upstream import compat
from vendor_graph.vendors.ascend import releases

GENERATIONS = tuple(os.environ.get("VENDOR_GRAPH_REAL_STACK_GENERATIONS", " ".join(releases.GENERATIONS)).split())
RELEASE = compat.series(compat.installed_lmdeploy_version())
OURS = "vendor_graph.vendors.ascend.runner.AscendGraphRunner"
# Camb and MACA: lmdeploy's CUDAGraphRunner as vendor_graph adopts it (vendor_graph.runtime.adopted)
ADOPTED = "vendor_graph.runtime.adopted.VendorGraphCUDAGraphRunner"
RUNNERS = {"ascend": OURS, "camb": ADOPTED, "maca": ADOPTED}
# The generation each leg runs its whole set of cases on (the others run the basic case).
FULL = "G5"


def check_pair(entry: dict, where: str, *, cut_short: int = 0) -> None:
    """``cut_short``: decode steps that may have begun and never finished (lmdeploy ends its spawned workers
    with SIGTERM at close, and a worker can be in a step it started ahead of need then)."""
    assert entry.get("error") is None, f"{where}: {entry.get('traceback')}"
    eager, graph = entry["eager"], entry["graph"]
    assert entry["tokens_equal"], f"{where}: {entry['first_difference']}"
    for run in (eager, graph):
        ours = RUNNERS[run.get("vendor", "ascend")]
        assert run["runner"] == ours and run["vendor_graph_active"], f"{where}: {run['runner']}"
        assert run["finish_reasons"] == ["length"] * run["requests"], f"{where}: {run['finish_reasons']}"
        assert [len(t) for t in run["tokens"]] == [8 + 3 * i for i in range(run["requests"])], where
    assert graph["captures"] > 0 and graph["replays"] > 0, f"{where}: {graph}"
    # the only eager steps are prefills; a decode step that fell back eager would be named here
    assert set(graph["eager_reasons"]) <= {"not a decode step"}, f"{where}: {graph['eager_reasons']}"
    assert eager["replays"] == 0 and eager["captures"] == 0
    batches = {int(b) for b in graph["histogram"]}
    assert {5, 3} <= batches, f"{where}: the batch never shrank inside a bucket: {graph['histogram']}"
    assert {6, 4, 2, 1} <= batches, f"{where}: the batch never crossed the buckets: {graph['histogram']}"
    # every decode step (warmup's included) captured or replayed a graph
    unfinished = sum(graph["histogram"].values()) - graph["replays"] - graph["captures"]
    assert 0 <= unfinished <= cut_short, f"{where}: {graph}"
