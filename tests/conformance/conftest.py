"""Conformance suite: the same decode checks on a backend chosen with ``--graph-backend``.

``sim`` (default, CI) runs on vendor_graph's CPU graph simulator, bitwise. ``cuda`` runs the Camb and
MACA buffer specs on lmdeploy's CUDA runner with real CUDA graphs on an NVIDIA GPU, ``npu`` the Ascend
runner on the installed torch_npu (never run here); both with a stated tolerance and equal greedy
tokens; ``maca`` and ``mlu`` run the Camb/MACA checks like ``cuda`` on MetaX and Cambricon devices
(never run). Checks that need the simulator itself (simulated torch_npu generations, device-op counts)
skip on real devices.
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
    if backend == "maca":  # MetaX's torch build presents itself as CUDA
        import torch

        return None if torch.cuda.is_available() else "no MACA device (torch.cuda.is_available() is False)"
    module = {"npu": "torch_npu", "mlu": "torch_mlu"}[backend]
    return None if importlib.util.find_spec(module) else f"{module} is not installed"


@pytest.fixture(scope="session")
def graph_backend(request):
    backend = request.config.getoption("--graph-backend")
    why = _available(backend)
    if why:
        pytest.skip(f"--graph-backend={backend}: {why}")
    from vendor_graph_sim.harness import REAL_BACKENDS

    assert backend == "sim" or backend in REAL_BACKENDS, f"--graph-backend={backend} has no harness path"
    if backend == "sim":
        from vendor_graph_sim import device as sim

        sim.install()
    return backend


@pytest.fixture(autouse=True)
def _no_device_work_carried_over():
    """A failed check can leave the simulator's streams holding work (a replay stuck at a wait) that would
    stall the next test in the process and fail it too: each test ends with the queues emptied."""
    yield
    from vendor_graph_sim import device as sim

    if sim.installed():
        sim.discard_queued_work()


@pytest.fixture(autouse=True)
def _own_stats_registry(monkeypatch):
    """The stats registry keeps every runner of the process, gone ones too (a closed pipeline's): each test's
    summaries and stats file report the runners it built, not those of earlier tests."""
    from vendor_graph.runtime import counters

    monkeypatch.setattr(counters, "_REGISTRY", counters._Registry())


@pytest.fixture
def cuda_style_backend(graph_backend):
    """Camb/MACA specs on lmdeploy's CUDA runner: the simulator or a CUDA-style device."""
    from vendor_graph_sim.harness import CUDA_STYLE_BACKENDS

    if graph_backend not in ("sim", *CUDA_STYLE_BACKENDS):
        pytest.skip(f"Camb/MACA specs run on lmdeploy's CUDA runner, not --graph-backend={graph_backend}")
    return graph_backend


@pytest.fixture
def ascend_backend(graph_backend):
    """The Ascend runner: on the simulator's torch_npu, or on a real NPU."""
    if graph_backend not in ("sim", "npu"):
        pytest.skip(f"the Ascend runner needs torch_npu: sim or npu, not --graph-backend={graph_backend}")
    return graph_backend


@pytest.fixture
def sim_backend(graph_backend):
    """For checks that need the simulator itself (simulated torch_npu generations, device-op counts)."""
    if graph_backend != "sim":
        pytest.skip(f"simulator-only check (--graph-backend={graph_backend})")
    return graph_backend


@pytest.fixture
def gloo_ranks(tmp_path):
    """``launch(script, world, *args)``: run ``script`` (Python source) as ``world`` processes on loopback gloo,
    each given ``rank world port out *args``; returns the JSON each wrote to ``out``, by rank. A rank that
    fails (or hangs past two minutes) fails the test with its output."""
    import json
    import os
    import socket
    import subprocess
    import sys

    def launch(script: str, world: int, *args: str) -> list:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        path = tmp_path / "rank.py"
        path.write_text(script)
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        procs = [subprocess.Popen([sys.executable, str(path), str(rank), str(world), str(port),
                                   str(tmp_path / f"rank{rank}.json"), *args],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for rank in range(world)]
        outputs = []
        try:
            for proc in procs:
                outputs.append(proc.communicate(timeout=180)[0])
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        for rank, proc in enumerate(procs):
            assert proc.returncode == 0, f"rank {rank} failed:\n{outputs[rank][-3000:]}"
        return [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(world)]

    return launch
