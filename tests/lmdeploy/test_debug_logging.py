"""``VENDOR_GRAPH_DEBUG=1`` prints a line per decode step, and vendor_graph's warnings reach the console, in a
process whose logging is configured and whose lmdeploy then raised the root logger's console handlers to ERROR
(lmdeploy's ``get_logger`` does, for every logger it makes)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("lmdeploy.utils")

from packaging.version import Version  # noqa: E402

from vendor_graph.upstream import compat  # noqa: E402

NEWEST = max((s for series in compat.SUPPORTED_SERIES.values() for s in series), key=Version)


ON_NEWEST = pytest.mark.skipif(compat.series(compat.installed_lmdeploy_version()) != NEWEST,
                               reason=f"the demo's logging does not depend on the release: once per test run, on "
                                      f"lmdeploy {NEWEST}")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VENDOR_GRAPH_")}
    return {**env, **extra}


@ON_NEWEST
def test_debug_prints_each_decode_step_of_the_demo_once():
    run = subprocess.run([sys.executable, "-m", "vendor_graph", "demo", "--model", "tiny", "--steps", "4", "--seqs",
                          "3"],
                         capture_output=True, text=True, timeout=300, env=_env(VENDOR_GRAPH_DEBUG="1"))
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stderr.splitlines()
    replayed = [line for line in lines if "DEBUG vendor_graph" in line and "replayed GraphKey" in line]
    captured = [line for line in lines if "captured GraphKey" in line]
    assert len(captured) == 1 and len(replayed) == 3, run.stderr[-3000:]  # 4 steps: a capture, then 3 replays


SCRIPT = textwrap.dedent("""
    import logging, sys
    logging.basicConfig(level=logging.{root_level})
    from lmdeploy.utils import get_logger
    get_logger("lmdeploy")  # raises the root logger's console handlers to ERROR
    from vendor_graph.config import switches
    switches.ensure_log_handler()
    log = logging.getLogger("vendor_graph")
    log.warning("a warning of vendor_graph")
    log.error("an error of vendor_graph")
""")


@pytest.mark.parametrize("root_level", ["WARNING", "DEBUG"])
def test_warnings_and_errors_reach_the_console_once(root_level):
    run = subprocess.run([sys.executable, "-c", SCRIPT.format(root_level=root_level)], capture_output=True,
                         text=True, timeout=120, env=_env())
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("a warning of vendor_graph") == 1, run.stderr
    assert run.stderr.count("an error of vendor_graph") == 1, run.stderr
