"""The README's main job, as a user runs it (its own process: the simulator is process-global)."""

import subprocess
import sys

from vendor_graph import compat


def test_demo_reports_parity_and_stats():
    vendor = compat.vendors_supporting(compat.installed_lmdeploy_version())[0]
    proc = subprocess.run([sys.executable, "-m", "vendor_graph", "demo", "--vendor", vendor, "--steps", "10",
                           "--seqs", "5", "--generation", "G3b"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Parity with eager over 10 steps" in proc.stdout and ": PASS" in proc.stdout
    assert "not a device speed" in proc.stdout
