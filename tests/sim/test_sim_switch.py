"""The simulator switch, ``VENDOR_GRAPH_SIM``: a fresh interpreter sees the simulated NPU from its start, and
only what the switch says changes (each case runs a child interpreter, as a user's script or lmdeploy's
worker starts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from once_per_run import newest_release_only
from vendor_graph_sim import boot

from vendor_graph.vendors.ascend.releases import GENERATIONS

pytestmark = newest_release_only


def child(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VENDOR_GRAPH_")}
    environ.update(OMP_NUM_THREADS="1", XDG_CACHE_HOME=str(tmp_path / "cache"), **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=environ, cwd=str(tmp_path), timeout=300)


def fake_dlinfer(root: Path, *, with_version: bool) -> Path:
    """A dlinfer source tree of our own: the package reads its vendor.yaml at import, as dlinfer's does."""
    package = root / "dlinfer"
    (package / "vendor" / "ascend").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "vendor" / "__init__.py").write_text(
        "from pathlib import Path\nVENDOR = (Path(__file__).parent / 'vendor.yaml').read_text()\n")
    (package / "vendor" / "ascend" / "__init__.py").write_text("")
    if with_version:
        (package / "vendor" / "ascend" / "version.py").write_text("def ensure_ascend_runtime():\n    return 'real'\n")
    return root


REPORT = """
    import json, multiprocessing, sys

    def worker(queue):
        import torch_npu
        queue.put(torch_npu.__version__)

    if __name__ == "__main__":
        before = sorted(m for m in ("torch", "lmdeploy", "torch_npu", "vendor_graph_sim.device") if m in sys.modules)
        import torch_npu, torch
        from torch_npu.contrib import transfer_to_npu
        x = torch.tensor([1, 2], device="cuda")
        import dlinfer, dlinfer.vendor, dlinfer.vendor.ascend.version as version
        ctx = multiprocessing.get_context("spawn")  # as lmdeploy's mp executor starts its workers
        queue = ctx.Queue()
        process = ctx.Process(target=worker, args=(queue,))
        process.start()
        print(json.dumps({"before": before, "version": torch_npu.__version__, "device": str(x.device),
                          "sim": bool(getattr(torch_npu, "__vendor_graph_sim__", False)),
                          "npu": torch.npu.get_device_name(), "worker": queue.get(timeout=120),
                          "dlinfer": dlinfer.__file__, "vendor_yaml": dlinfer.vendor.VENDOR,
                          "standin": getattr(version, "__vendor_graph_test_standin__", None)}))
        process.join(60)
"""


@pytest.mark.parametrize(("value", "release", "with_version"), [("G5", boot.pinned_release("G5"), False),
                                                               ("2.6.0", "2.6.0", True)])
def test_a_fresh_interpreter_and_its_workers_see_the_simulated_npu_and_dlinfer_laid_out(tmp_path, value, release,
                                                                                         with_version):
    """Nothing heavy at start; ``torch_npu`` is the simulated release, ``cuda`` means the NPU after
    ``transfer_to_npu``; dlinfer is the source tree laid out with its vendor.yaml in the cache (the tree itself
    never written), with a stand-in only for a module it lacks; a spawned worker sees the same NPU."""
    source = fake_dlinfer(tmp_path / "src", with_version=with_version)
    script = tmp_path / "user.py"
    script.write_text(textwrap.dedent(REPORT))
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VENDOR_GRAPH_")}
    environ.update(OMP_NUM_THREADS="1", XDG_CACHE_HOME=str(tmp_path / "cache"), VENDOR_GRAPH_SIM=value,
                   VENDOR_GRAPH_DLINFER_SRC=str(source))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=environ,
                          cwd=str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report["before"] == []  # the .pth line only put a finder in place
    assert report["sim"] and report["version"] == report["worker"] == release
    assert report["device"] == "npu:0" and report["npu"].startswith("Ascend910")
    assert report["dlinfer"].startswith(str(tmp_path / "cache" / "vendor_graph" / "dlinfer-staged"))
    assert report["vendor_yaml"] == boot.ASCEND_VENDOR_YAML
    assert (report["standin"] is None) == with_version
    assert not (source / "dlinfer" / "vendor" / "vendor.yaml").exists()


def test_generations_are_taken_in_any_case():
    assert boot.pinned_release("g2b") == boot.pinned_release("G2b")


def test_unset_nothing_runs(tmp_path):
    proc = child("import sys; print('vendor_graph_sim.boot' in sys.modules); import torch_npu", tmp_path)
    assert proc.stdout.strip() == "False"
    assert "No module named 'torch_npu'" in proc.stderr


@pytest.mark.parametrize("value", ["G9", "2.99.0", "banana"])
def test_a_bad_value_is_refused_naming_the_valid_generations(tmp_path, value):
    proc = child("import torch_npu", tmp_path, VENDOR_GRAPH_SIM=value)
    assert proc.returncode == 1
    assert "ImportError" in proc.stderr and f"VENDOR_GRAPH_SIM={value!r}" in proc.stderr
    assert ", ".join(GENERATIONS) in proc.stderr
    assert proc.stderr.startswith("vendor_graph_sim: VENDOR_GRAPH_SIM=")  # said once at start, too


def test_a_real_torch_npu_beside_it_is_refused_and_left_alone(tmp_path):
    real = tmp_path / "site" / "torch_npu"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("REAL = True\n")
    proc = child("import sys; import torch_npu", tmp_path, VENDOR_GRAPH_SIM="G5", PYTHONPATH=str(real.parent))
    assert proc.returncode == 1
    assert "a real torch_npu is installed" in proc.stderr and "unset VENDOR_GRAPH_SIM" in proc.stderr


def fake_vendor_dlinfer(root: Path) -> Path:
    """A dlinfer source tree with the three vendors' packages, reading its vendor.yaml at import as dlinfer does."""
    package = root / "dlinfer"
    for vendor in ("ascend", "camb", "maca"):
        (package / "vendor" / vendor).mkdir(parents=True)
        (package / "vendor" / vendor / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "vendor" / "__init__.py").write_text(
        "from pathlib import Path\nVENDOR = (Path(__file__).parent / 'vendor.yaml').read_text()\n")
    return root


# Each vendor's way up to the device, then one report (``standin``: the vendor kernel package it imported).
_CUDA_STYLE_REPORT_TAIL = """
        print(json.dumps({"before": before, "plain_cuda": plain, "device": str(x.device), "is_cuda": x.is_cuda,
                          "graph": torch.cuda.CUDAGraph.__name__, "name": torch.cuda.get_device_name(),
                          "vendor_yaml": dlinfer.vendor.VENDOR,
                          "vendors": sorted(os.listdir(os.path.dirname(dlinfer.vendor.__file__))),
                          "standin": getattr(standin, "__vendor_graph_test_standin__", None)}))
"""
CUDA_STYLE_REPORT = {
    "camb": """
        import json, os, sys
        before = sorted(m for m in ("torch", "lmdeploy", "torch_mlu", "vendor_graph_sim.device") if m in sys.modules)
        import torch, torch_mlu
        plain = torch.cuda.is_available()  # torch_mlu imported, its GPU migration not yet
        from torch_mlu.utils.gpu_migration import migration
        x = torch.tensor([1, 2], device="cuda")
        import dlinfer, dlinfer.vendor, torch_mlu_ops as standin
""" + _CUDA_STYLE_REPORT_TAIL,
    "maca": """
        import json, os, sys
        before = sorted(m for m in ("torch", "lmdeploy", "vendor_graph_sim.device") if m in sys.modules)
        import torch
        plain = not torch.cuda.is_available()  # a MACA torch: cuda is the device from the start
        import dlinfer, dlinfer.vendor, flash_attn as standin
        x = torch.tensor([1, 2], device="cuda")
""" + _CUDA_STYLE_REPORT_TAIL,
}


@pytest.mark.parametrize(("vendor", "device", "graph"),
                         [("camb", "mlu:0", "MLUGraph"), ("maca", "maca:0", "CUDAGraph")])
def test_camb_and_maca_switch_bring_their_device_up_as_their_runtime_does(tmp_path, vendor, device, graph):
    """Camb: ``torch_mlu`` is the simulated package, and ``cuda`` means the MLU once its GPU migration is imported
    (as dlinfer's camb package does); MACA: the device comes up with torch, ``cuda`` meaning it from then on. Each
    sees dlinfer laid out as its ``DEVICE=<vendor>`` build (vendor.yaml, no other vendor's package) and its vendor
    kernels as labelled stand-ins."""
    source = fake_vendor_dlinfer(tmp_path / "src")
    proc = child(CUDA_STYLE_REPORT[vendor], tmp_path, VENDOR_GRAPH_SIM=vendor.upper(),
                 VENDOR_GRAPH_DLINFER_SRC=str(source))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report["before"] == [] and report["plain_cuda"] is False  # camb: before the migration; maca: negated
    assert report["device"] == device and report["is_cuda"] and report["graph"] == graph
    assert report["vendor_yaml"] == boot.VENDOR_YAML[vendor]
    assert report["vendors"] == ["__init__.py", vendor, "vendor.yaml"]
    assert report["standin"]


@pytest.mark.parametrize(("vendor", "runtime", "trigger"), [("camb", "torch_mlu", "import torch_mlu"),
                                                            ("maca", "mcoplib", "import dlinfer")])
def test_a_real_camb_or_maca_runtime_beside_it_is_refused(tmp_path, vendor, runtime, trigger):
    real = tmp_path / "site" / runtime
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("REAL = True\n")
    source = fake_vendor_dlinfer(tmp_path / "src")
    proc = child(trigger, tmp_path, VENDOR_GRAPH_SIM=vendor, PYTHONPATH=str(real.parent),
                 VENDOR_GRAPH_DLINFER_SRC=str(source))
    assert proc.returncode == 1
    assert f"a real {runtime} is installed" in proc.stderr and "unset VENDOR_GRAPH_SIM" in proc.stderr
    assert proc.stderr.count(f"a real {runtime} is installed") == 2, proc.stderr  # at start, and raised at the import
    assert "ImportError" in proc.stderr


def test_camb_and_maca_name_no_torch_npu():
    with pytest.raises(boot.SimSwitchError, match="has no torch_npu"):
        boot.pinned_release("camb")
