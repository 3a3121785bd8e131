"""The stats file's writer is armed by activation, never by the step path: a process that activates a vendor
writes its runners' stats file at exit (per rank) and every ``VENDOR_GRAPH_STATS_EVERY`` minutes, while the step
path's modules import nothing of ``vendor_graph.ops``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from vendor_graph.upstream import compat

ROOT = Path(__file__).resolve().parents[2]
SUPPORTED_HERE = compat.vendors_supporting(compat.installed_lmdeploy_version())


def _child(code: str, **env_vars: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VENDOR_GRAPH_")}
    env.update(OMP_NUM_THREADS="1", **env_vars)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=300, cwd=str(ROOT))


def test_the_step_path_imports_no_reports():
    proc = _child("""
        import sys
        import vendor_graph.runtime.adopted, vendor_graph.runtime.counters, vendor_graph.runtime.step
        reports = sorted(m for m in sys.modules if m.startswith("vendor_graph.ops"))
        assert not reports, reports
    """)
    assert proc.returncode == 0, proc.stderr


def test_activation_starts_the_periodic_writer_and_arms_the_exit_write(tmp_path):
    target = tmp_path / "s.json"
    proc = _child(f"""
        import threading
        from types import SimpleNamespace

        import vendor_graph.{SUPPORTED_HERE[0]}
        from vendor_graph.runtime import counters

        assert any(t.name == "vendor_graph-stats" and t.daemon for t in threading.enumerate())

        class Runner:
            label, vendor = "vendor_graph.cuda", "cuda"
            stats = counters.GraphStats()
            capture_plan = None

            def capture_sizes(self):
                return [1, 2, 4]

        runner = Runner()
        counters.register(runner)
        runner.stats.decoded(3, 1)
        runner.stats.replayed(4, 3, 4)
    """, VENDOR_GRAPH_STATS_FILE=str(target), VENDOR_GRAPH_STATS_EVERY="5", RANK="1", WORLD_SIZE="2")
    assert proc.returncode == 0, proc.stderr
    written = tmp_path / "s.rank1.json"  # one file per rank
    doc = json.loads(written.read_text())
    assert doc["reason"] == "exit" and doc["rank"] == 1 and doc["batch_histogram"] == {"3": 1}
    assert not target.exists()
