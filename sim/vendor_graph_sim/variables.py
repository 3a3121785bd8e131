"""The ``VENDOR_GRAPH_*`` variables that the simulator and the test harness (tests/, scripts/, tools/,
benchmarks/) read, each declared once with its meaning. vendor_graph finds them through the
``vendor_graph.variables`` entry points of sim/pyproject.toml, so that ``vendor-graph doctor`` lists them and
activation does not take them for typos, without the runtime importing the simulator.

Imports only vendor_graph's settings: ``vendor_graph_sim.boot`` reads it at interpreter start.
"""

from __future__ import annotations

import os

from vendor_graph.config import settings
from vendor_graph.config.kinds import SourceTree, TorchNpuRelease


class SimulatedDevice(TorchNpuRelease):
    """``camb`` or ``maca`` (any case: the simulated MLU or MACA device), or a torch_npu generation or release (the
    simulated NPU of it)."""

    VENDORS = ("camb", "maca")

    @property
    def accepted(self) -> str:
        return f"{' or '.join(self.VENDORS)}, or {super().accepted}"

    advice = "name a generation such as G5, a release that `vendor-graph paths` lists, or camb or maca"

    def parse(self, text: str) -> str:
        if text.lower() in self.VENDORS:
            return text.lower()
        return super().parse(text)


SIM_SWITCH = settings.Setting(
    settings.SIM_SWITCH, "the simulator switch: every interpreter sees the simulated device from its start "
    "(vendor_graph_sim.boot): camb's MLU, maca's device, or the NPU of this torch_npu generation or release",
    kind=SimulatedDevice(), none="off", scope="simulator")
DLINFER_SRC = settings.Setting(
    "VENDOR_GRAPH_DLINFER_SRC", "the dlinfer source tree the real-stack tests and demo run on the simulator",
    kind=SourceTree("dlinfer"), none="an installed dlinfer, if any", scope="simulator")
TORCH_NPU_MANIFESTS = settings.Setting(
    "VENDOR_GRAPH_TORCH_NPU_MANIFESTS", "the folder of torch_npu release manifests the simulator reads",
    scope="simulator")
SIMULATOR = (SIM_SWITCH, DLINFER_SRC, TORCH_NPU_MANIFESTS)


def _tooling(name: str, meaning: str) -> settings.Setting:
    return settings.Setting(name, meaning, scope="tooling")


TEST_HARNESS = (
    _tooling("VENDOR_GRAPH_VENV", "the demo's virtualenv (scripts/setup-env.sh and demo.sh)"),
    _tooling("VENDOR_GRAPH_TEST_VENVS", "the folder of the test environments scripts/test.sh builds and uses "
             "(default .venvs)"),
    _tooling("VENDOR_GRAPH_LMDEPLOY_VERSIONS", "the lmdeploy releases scripts/test.sh tests"),
    _tooling("VENDOR_GRAPH_SKIP_OLDEST_TORCH", "1: scripts/test.sh leaves out the oldest-torch leg"),
    _tooling("VENDOR_GRAPH_MUTATIONS_ON", "the lmdeploy release scripts/test.sh runs the mutation checks with "
             "(default 0.17.0)"),
    _tooling("VENDOR_GRAPH_OLDEST_VENV", "the virtualenv of the oldest-torch leg"),
    _tooling("VENDOR_GRAPH_OLDEST_TORCH", "the torch release of the oldest-torch leg"),
    _tooling("VENDOR_GRAPH_OLDEST_LMDEPLOY", "the lmdeploy release of the oldest-torch leg"),
    _tooling("VENDOR_GRAPH_OLDEST_TORCH_LEG", "1: the tests run as the oldest-torch leg"),
    _tooling("VENDOR_GRAPH_WHEEL_CACHE", "where tests keep the torch_npu wheels they download"),
    _tooling("VENDOR_GRAPH_NETWORK_TESTS", "1: run the tests that download from PyPI"),
    _tooling("VENDOR_GRAPH_REEXTRACT", "the torch_npu releases the manifest re-extraction test checks"),
    _tooling("VENDOR_GRAPH_RANDOM_SCHEDULES", "random schedules the conformance suite runs"),
    _tooling("VENDOR_GRAPH_PROPERTY_EXAMPLES", "examples the property tests run"),
    _tooling("VENDOR_GRAPH_FUZZ_EXAMPLES", "examples each fuzz test (tests/fuzz) runs (default 80)"),
    _tooling("VENDOR_GRAPH_CONFORMANCE_SCHEDULES", "seeded schedules per decode-parity case"),
    _tooling("VENDOR_GRAPH_CONFORMANCE_GENERATIONS", "the torch_npu generations the decode-parity matrix runs "
             "(space-separated; default every one with a graph API)"),
    _tooling("VENDOR_GRAPH_REAL_STACK_GENERATIONS", "the torch_npu generations the real-stack leg runs (default all)"),
    _tooling("VENDOR_GRAPH_REAL_DEVICE", "ascend, camb or maca: tests/realstack/test_engine.py runs lmdeploy's engine "
             "on this machine's real device of that vendor, not the simulator (the hardware workflows)"),
)


def dlinfer_src() -> str | None:
    """The dlinfer source root :data:`DLINFER_SRC` names (None: unset); ``SettingsError`` naming the fix when it
    holds no ``dlinfer/__init__.py``."""
    return DLINFER_SRC.parse(os.environ.get(DLINFER_SRC.name))
