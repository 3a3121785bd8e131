import subprocess
import sys

from vendor_graph import compat

SUPPORTED = compat.vendors_supporting(compat.installed_lmdeploy_version())


def test_plan_prints_patches_sizes_buffers_and_a_passing_self_check():
    vendor = SUPPORTED[0]
    proc = subprocess.run([sys.executable, "-m", "vendor_graph", "plan", "--vendor", vendor, "--max-batches", "48"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "CudaGraphMixin.fill_buffers_cudagraph" in out and f"vendor_graph.{vendor}.fill_buffers_cudagraph" in out
    assert "Capture plan: max_batch_size 48" in out
    assert "kv_start_indices" in out and "Self-check" in out and ": PASS" in out


def test_plan_refuses_an_unsupported_release_with_the_reason():
    unsupported = [v for v in ("camb", "maca") if v not in SUPPORTED]
    if not unsupported:
        return
    proc = subprocess.run([sys.executable, "-m", "vendor_graph", "plan", "--vendor", unsupported[0]],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "NOT ACTIVE" in proc.stdout and "Supported: 0.16.x, 0.17.x" in proc.stdout
