import os
import subprocess
import sys

from vendor_graph.upstream import compat

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
    # the refusal is the one line on stderr (it was a "NOT ACTIVE" line on stdout)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"vendor-graph plan: error: vendor_graph.{unsupported[0]} does not support the "
                                  f"installed lmdeploy")
    assert "Supported: 0.16.x, 0.17.x" in proc.stderr


def test_plan_explains_how_explicit_sizes_are_normalised():
    proc = subprocess.run([sys.executable, "-m", "vendor_graph", "plan", "--vendor", SUPPORTED[0], "--max-batches",
                           "16", "--capture-sizes", "8", "4", "300"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ("Capture plan: max_batch_size 16, explicit cudagraph_capture_batch_sizes: 3 graphs" in proc.stdout)
    assert ("note: --capture-sizes 8 4 300 normalised as lmdeploy does: sorted; 300 dropped (above max_batch_size "
            "16); max_batch_size 16 added (always captured)") in proc.stdout


def test_plan_under_another_vendors_setting_is_a_one_line_conflict():
    other = next(v for v in ("ascend", "camb", "maca") if v != SUPPORTED[0])
    env = {k: v for k, v in os.environ.items() if not k.startswith("VENDOR_GRAPH_")}
    proc = subprocess.run([sys.executable, "-m", "vendor_graph", "plan", "--vendor", SUPPORTED[0]],
                          capture_output=True, text=True, timeout=300, env=dict(env, VENDOR_GRAPH_VENDOR=other))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("vendor-graph plan: error: ")
    assert f"VENDOR_GRAPH_VENDOR={other}" in proc.stderr
