"""Many short seeded random schedules (vendor, torch_npu generation, attention op, batch sizes,
sequence lengths, retirements): graph equals eager and KV bytes match at every step.

CI runs ``VENDOR_GRAPH_RANDOM_SCHEDULES`` of them (default 120); ``tools/soak.py`` runs any number."""

import os

import pytest
from vendor_graph_sim.schedules import case, run_case

COUNT = int(os.environ.get("VENDOR_GRAPH_RANDOM_SCHEDULES", "120"))


@pytest.mark.parametrize("seed", range(COUNT))
def test_random_schedule(sim_backend, seed):
    c = case(seed)
    pair = run_case(c)
    assert not pair.mismatches, f"{c}: {pair.mismatches[:3]}"
