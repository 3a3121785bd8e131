"""What keeps the H200 run of Camb's and MACA's engine path (benchmarks/engine_vendors.py, ``h200.sh part8``) honest
between GPU runs, without a GPU: its set-up on a machine with a real device (dlinfer laid out per vendor, the vendor
kernel stand-ins, no simulated device; torch_mlu's migration the other way round), and the saved results, which
must cover what the script runs now and pass its own verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from load_by_path import load_by_path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "engine_vendors_h200"
bench = load_by_path("_vg_engine_vendors", ROOT / "benchmarks" / "engine_vendors.py")


def child(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VENDOR_GRAPH_") and k != "PYTHONPATH"}
    environ.update(OMP_NUM_THREADS="1", XDG_CACHE_HOME=str(tmp_path / "cache"), **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=environ,
                          cwd=str(tmp_path), timeout=300)


def test_the_saved_gpu_results_cover_what_the_script_runs_and_pass_its_verdict():
    for vendor, pairs in bench.MODELS.items():
        record = json.loads((RESULTS / f"engine_{vendor}.json").read_text())
        assert record["command"] == f"python benchmarks/engine_vendors.py {vendor} engine_{vendor}.json"
        ran = [(r["model"], r["case"]) for r in record["results"]]
        assert ran == [(model, case) for model, cases in pairs for case in cases], "rerun h200.sh part8"
        assert record["passed"] and record["gpu"].startswith("NVIDIA")
        for r in record["results"]:
            assert r["problems"] == bench.verdict(r["graph"], r["eager"], r["tokens_equal"]) == [], r["problems"]
            assert r["graph"]["vendor"] == vendor and r["graph"]["replays"] > 0
    assert (RESULTS / "summary.md").read_text() == bench.report(RESULTS.relative_to(ROOT))


def test_the_verdict_names_what_went_wrong():
    graph = {"runner": "lmdeploy.pytorch.backends.cuda.graph_runner.CUDAGraphRunner", "replays": 0, "captures": 2,
             "histogram": {"1": 3}}
    assert bench.verdict(graph, {"captures": 0, "replays": 0}, False) == [
        "graph tokens differ from eager's",
        "lmdeploy built lmdeploy.pytorch.backends.cuda.graph_runner.CUDAGraphRunner runner, not vendor_graph's",
        "no graph replayed", "3 decode steps, 2 captures + 0 replays"]


def test_on_a_real_device_dlinfer_is_laid_out_for_the_vendor_with_its_standins_and_no_simulated_device(
        tmp_path, dlinfer_available):
    origin, source = dlinfer_available
    if source is None:
        pytest.skip("an installed dlinfer is built for one vendor: the layout is checked on a source tree")
    proc = child("""
        import json, torch
        from vendor_graph_sim import boot
        boot.serve_vendor("maca")
        import dlinfer.vendor, dlinfer.ops, flash_attn, mcoplib
        query = torch.randn(3, 2, 8)
        normed = dlinfer.ops.rms_norm(query, torch.ones(8), 1e-6)  # dlinfer's maca op over the mcoplib stand-in
        reference = query * torch.rsqrt(query.pow(2).mean(-1, keepdim=True) + 1e-6)
        standin = bool(flash_attn.__vendor_graph_test_standin__)
        print(json.dumps({"vendor": dlinfer.vendor.vendor_name, "standin": standin,
                          "privateuse1": torch._C._get_privateuse1_backend_name(),
                          "cuda": torch.cuda.is_available(), "close": torch.allclose(normed, reference, atol=1e-5)}))
    """, tmp_path, VENDOR_GRAPH_DLINFER_SRC=str(source))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report == {"vendor": "maca", "standin": True, "privateuse1": "privateuseone", "cuda": False, "close": True}


def test_torch_mlu_on_cuda_sends_mlu_allocations_to_cuda(tmp_path):
    proc = child("""
        import torch
        from vendor_graph_sim.device import _cuda_style
        _cuda_style.install_torch_mlu_on_cuda()
        from torch_mlu.utils.gpu_migration import migration
        import torch_mlu
        assert torch_mlu.mlu is torch.cuda and torch.ones(2, device="cpu").device.type == "cpu"
        torch.ones(8192, dtype=torch.float32, device="mlu")  # dlinfer's camb package, at import
    """, tmp_path)
    assert proc.returncode == 1
    assert "Torch not compiled with CUDA enabled" in proc.stderr, proc.stderr[-2000:]  # it went to cuda
