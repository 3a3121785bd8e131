"""vendor-graph doctor / run / demo-in-a-child, each as a user runs it (a child interpreter)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vendor_graph.ops import doctor
from vendor_graph.upstream import compat

SUPPORTED = compat.vendors_supporting(compat.installed_lmdeploy_version())
CHECK = ("import os, vendor_graph, lmdeploy.pytorch.models.utils.cudagraph as m; "
         "print('vendor', os.environ.get('VENDOR_GRAPH_VENDOR'), vendor_graph.active_vendor(), "
         "m.CudaGraphMixin.fill_buffers_cudagraph.__module__)")


def _cli(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "vendor_graph", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _env(**changes):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VENDOR_GRAPH_")}
    env.update(changes)
    return env


def test_doctor_without_any_vendor_runtime():
    proc = _cli("doctor", env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for section in ("Vendor runtimes", "torch_npu not installed", f"lmdeploy {compat.installed_lmdeploy_version()}",
                    "CudaGraphMixin owners", "fill_buffers_cudagraph     lmdeploy (its own)",
                    "autoload hook vendor_graph_autoload.pth: installed", "none set (all defaults)",
                    "no problems found"):
        assert section in out, section


def test_doctor_activates_a_vendor_and_flags_a_misspelt_setting():
    vendor = SUPPORTED[0]
    proc = _cli("doctor", "--vendor", vendor, env=_env(VENDOR_GRAPH_SHADWO="4", VENDOR_GRAPH_SHADOW="4"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert f"CudaGraphMixin owners (after activating {vendor})" in out
    assert f"fill_buffers_cudagraph     vendor_graph (vendor_graph.{vendor})" in out
    assert "VENDOR_GRAPH_SHADOW=4  (N: every Nth replay" in out
    assert "! VENDOR_GRAPH_SHADWO=4: not a vendor_graph setting (a typo?)" in out and "1 problem(s) found" in out


def test_doctor_reads_torch_npu_generation_and_paths_from_the_release_table():
    lines = doctor._torch_npu_lines("2.8.0.post2")
    assert lines[0] == "  generation G3a; seq-len update path per attention op:"
    assert any("FIA `.default`" in line and line.endswith("graph-update") for line in lines)
    assert any("paged attention MLA" in line and line.endswith("task-update") for line in lines)
    assert doctor._torch_npu_lines("2.4.0")[-1].startswith("! this torch_npu has no NPUGraph API")
    assert "not a known PyPI release" in doctor._torch_npu_lines("2.8.0.post1")[0]


def test_run_activates_the_vendor_in_the_command_and_its_workers():
    vendor = SUPPORTED[0]
    worker = f"import subprocess, sys; {CHECK}; subprocess.run([sys.executable, '-c', {CHECK!r}], check=True)"
    proc = _cli("run", "--vendor", vendor, "--", sys.executable, "-c", worker,
                env=_env(VENDOR_GRAPH_DISABLE_AUTOLOAD="1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = f"vendor {vendor} {vendor} vendor_graph.{vendor}"
    assert proc.stdout.splitlines() == [expected, expected]  # the command, then a process it started
    assert "ignoring VENDOR_GRAPH_DISABLE_AUTOLOAD" in proc.stderr


def test_without_run_nothing_is_activated():
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300, env=_env())
    owner = "lmdeploy.pytorch.models.utils.cudagraph"
    assert proc.returncode == 0 and proc.stdout.split()[1:] == ["None", "None", owner]


def test_run_errors_name_the_fix():
    proc = _cli("run", "--vendor", "ascend", env=_env())
    assert proc.returncode == 2 and "usage: vendor-graph run --vendor ascend -- lmdeploy serve" in proc.stderr
    proc = _cli("run", "--vendor", "ascend", "--", "no-such-command-xyz", env=_env())
    assert proc.returncode == 2 and "'no-such-command-xyz' not found on PATH" in proc.stderr


def test_console_script_is_the_module():
    script = shutil.which("vendor-graph", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("vendor-graph console script not installed in this environment")
    proc = subprocess.run([script, "paths"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith("| torch_npu | generation |")


def test_demo_runs_the_simulator_in_a_child_when_a_real_torch_npu_is_installed(tmp_path):
    """A torch_npu that torch would autoload takes PrivateUse1; the tiny decoder's demo re-runs itself with
    TORCH_DEVICE_BACKEND_AUTOLOAD=0. The stand-in torch_npu here fails if anything imports it."""
    fake = tmp_path / "torch_npu"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('the real torch_npu was imported')\n")
    env = _env(PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    proc = _cli("demo", "--model", "tiny", "--vendor", SUPPORTED[0], "--steps", "4", "--seqs", "3", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("a real torch_npu is installed: running the simulator in a child process with "
                                  "TORCH_DEVICE_BACKEND_AUTOLOAD=0")
    assert "Parity with eager over 4 steps" in proc.stdout and ": PASS" in proc.stdout
