"""The simulator renames torch's PrivateUse1 backend process-wide: tests/sim runs in its own pytest process."""

import sys
from pathlib import Path

import pytest
from vendor_graph_sim import device as sim

sim.install()
sys.path.insert(0, str(Path(__file__).parent))  # sim_test_ops: the test-only stand-in ops


@pytest.fixture(autouse=True)
def _clean_sim_state():
    """Each test starts on the default stream, with empty queues, default switches and zeroed counters."""
    saved = {name: getattr(sim.config, name) for name in sim.SimConfig.__dataclass_fields__}
    sim.reset_counters()
    yield
    for name, value in saved.items():
        setattr(sim.config, name, value)
    from vendor_graph_sim.device import _runtime

    left_open = bool(_runtime.state().captures)
    sim.discard_queued_work()
    assert not left_open, "a test left a graph capture open"


@pytest.fixture
def lazy():
    """Deferred execution: nothing runs until a sync point."""
    with sim.configured(eager_drain=False):
        yield
