"""Conformance suite: the same decode checks on a backend chosen with ``--graph-backend``.

``sim`` (default, CI) runs on vendor_graph's CPU graph simulator; ``cuda``, ``npu``, ``mlu`` and ``maca``
select real hardware and skip cleanly where it is absent (their runs are defined in the hardware CI).
"""

import importlib.util

import pytest

BACKENDS = ("sim", "cuda", "npu", "mlu", "maca")


def pytest_addoption(parser):
    parser.addoption("--graph-backend", default="sim", choices=BACKENDS,
                     help="where graphs are captured and replayed (default: sim, the CPU simulator)")
    parser.addoption("--conformance-schedules", type=int, default=None,
                     help="random schedules per configuration (default: the suite's CI count)")


def _available(backend: str) -> str | None:
    """None when ``backend`` can run here, else why not."""
    if backend == "sim":
        return None
    if backend == "cuda":
        import torch

        return None if torch.cuda.is_available() else "no CUDA device"
    module = {"npu": "torch_npu", "mlu": "torch_mlu", "maca": "torch"}[backend]
    if backend == "maca":
        return "MACA hardware runs are defined in .github/workflows (not on this machine)"
    return None if importlib.util.find_spec(module) else f"{module} is not installed"


@pytest.fixture(scope="session")
def graph_backend(request):
    backend = request.config.getoption("--graph-backend")
    why = _available(backend)
    if why:
        pytest.skip(f"--graph-backend={backend}: {why}")
    if backend != "sim":
        pytest.skip(f"--graph-backend={backend}: this suite's hardware path lands with the hardware CI jobs")
    from vendor_graph.testing import sim

    sim.install()
    return backend
