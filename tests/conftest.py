import importlib.util
import os
import sys
from pathlib import Path

import pytest

STUBS = Path(__file__).resolve().parents[1] / "sim" / "vendor_graph_sim" / "data" / "standins"
sys.path.insert(0, str(Path(__file__).parent))  # load_by_path: the one way tests import a file by path

# The stand-in dlinfer, for this process and for the worker processes tests spawn; never in front of a
# real dlinfer (an Ascend machine running the hardware workflows has one).
if importlib.util.find_spec("dlinfer") is None:
    sys.path.insert(0, str(STUBS))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(STUBS), os.environ.get("PYTHONPATH")) if p)
# Tests choose their vendor explicitly; an inherited activation would leak into them.
os.environ.pop("VENDOR_GRAPH_VENDOR", None)


@pytest.fixture(scope="session")
def dlinfer_available():
    """(how dlinfer is provided, its source root or None) for the tests that run the real dlinfer
    (:func:`vendor_graph_sim.realstack.dlinfer_origin`): an unusable ``VENDOR_GRAPH_DLINFER_SRC`` fails them; no
    dlinfer at all (the stand-in above runs no kernel and does not count) skips them, saying how to provide one."""
    from vendor_graph_sim import realstack

    from vendor_graph.config import settings

    try:
        return realstack.dlinfer_origin()
    except settings.SettingsError as exc:
        pytest.fail(f"the dlinfer setting is unusable: {exc}")
    except realstack.DlinferUnavailable as exc:
        pytest.skip(str(exc))


def pytest_collection_finish(session):
    """What collection imported (torch, lmdeploy, every test module) is never garbage: kept out of the
    cyclic collector, so each graph capture's ``gc.collect()`` (torch's graph context runs one, and so
    does the simulator's) walks only what tests make."""
    import gc

    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _no_vendor_active():
    """Each test starts and ends with no vendor active (importing vendor_graph.<vendor>.<module>
    during collection activates that vendor), and with lmdeploy's CudaGraphMixin as it found it: a test that
    imports (the stand-in) dlinfer's lmdeploy extension leaves dlinfer's methods on the class, which a later
    test on lmdeploy's own runner would run."""
    import vendor_graph

    vendor_graph.uninstall()
    mixin = getattr(sys.modules.get("lmdeploy.pytorch.models.utils.cudagraph"), "CudaGraphMixin", None)
    found = dict(vars(mixin)) if mixin is not None else None
    yield
    vendor_graph.uninstall()  # first: it puts back what it displaced, which may be dlinfer's
    if found is not None:
        for name in set(vars(mixin)) - set(found):
            delattr(mixin, name)
        for name, value in found.items():
            if vars(mixin).get(name) is not value:
                setattr(mixin, name, value)


@pytest.fixture(autouse=True)
def _fresh_settings():
    """Each test reads the settings of its own environment: another test's last parse does not carry over."""
    from vendor_graph.config import settings

    settings.clear()
    yield
    settings.clear()
