"""Errors where a graph runner is built: inside lmdeploy they keep their type and their one-line message (lmdeploy's
own logging decides how they print); ``vendor-graph demo`` and ``plan`` print them as one line, exit status 2;
and ``plan`` shows the sizes the runtime would capture under ``VENDOR_GRAPH_CAPTURE_SIZES``."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from vendor_graph.config import settings
from vendor_graph.sizing.capacity import CapturePlanError
from vendor_graph.upstream import compat

SUPPORTED = compat.vendors_supporting(compat.installed_lmdeploy_version())
ASCEND_BACKEND = ("lmdeploy.pytorch.backends.dlinfer.ascend.op_backend", "AscendOpsBackend")


def _env(**changes: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VENDOR_GRAPH_") or k == "VENDOR_GRAPH_DLINFER_SRC"}
    env.update(changes)
    return env


def _cases(tmp_path):
    """(environment, what the one line says) for each runner-build refusal of issue 29."""
    return [
        ({"VENDOR_GRAPH_CAPTURE_SIZES": "100000"}, CapturePlanError,
         "VENDOR_GRAPH_CAPTURE_SIZES: cudagraph_capture_batch_sizes [100000] are all above max_batch_size"),
        ({"VENDOR_GRAPH_PLAN": "auto"}, CapturePlanError, "VENDOR_GRAPH_PLAN=auto needs VENDOR_GRAPH_STATS_FILE=PATH"),
        ({"VENDOR_GRAPH_PLAN": "auto", "VENDOR_GRAPH_CAPTURE_SIZES": "1,2",
          "VENDOR_GRAPH_STATS_FILE": str(tmp_path / "s.json")}, CapturePlanError,
         "VENDOR_GRAPH_PLAN=auto fits the capture sizes to the stats file, but VENDOR_GRAPH_CAPTURE_SIZES also gives"),
        ({"VENDOR_GRAPH_STATS_FILE": str(tmp_path / "nope" / "s.json")}, settings.SettingsError,
         f"VENDOR_GRAPH_STATS_FILE='{tmp_path / 'nope' / 's.json'}': directory {tmp_path / 'nope'} does not exist"),
        ({"VENDOR_GRAPH_STATS_FILE": str(tmp_path / "s.json"), "VENDOR_GRAPH_STATS_EVERY": str(10**12)},
         settings.SettingsError, f"VENDOR_GRAPH_STATS_EVERY='{10**12}': {10**12} is above"),
    ]


def _build_ascend_runner():
    """The patched Ascend builder called the way lmdeploy's ModelAgent calls it, with CPU stand-ins."""
    import torch

    class Model(torch.nn.Module):
        ctx_mgr = SimpleNamespace(build_ctx=SimpleNamespace(strategy_factory=None))

    module, name = ASCEND_BACKEND
    backend = getattr(importlib.import_module(module), name)
    model_config = SimpleNamespace(k_head_dim=64, v_head_dim=64, model_paradigm="ar", use_flash_mla=False)
    cache_config = SimpleNamespace(max_batches=8, num_gpu_blocks=16, cudagraph_capture_batch_sizes=None)
    backend_config = SimpleNamespace(eager_mode=False, device_type="ascend", piecewise_cudagraph_max_tokens=None)
    return backend.build_graph_runner(Model(), model_config, cache_config, backend_config, "cpu")


@pytest.mark.skipif("ascend" not in SUPPORTED, reason="ascend unsupported on this lmdeploy")
@pytest.mark.parametrize("case", range(5))
def test_inside_lmdeploy_the_error_keeps_its_type_and_one_line(case, tmp_path, monkeypatch, activate):
    env, kind, message = _cases(tmp_path)[case]
    for name in [m for m in sys.modules if m.startswith("dlinfer.framework")]:
        monkeypatch.delitem(sys.modules, name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(kind) as info:  # a setting activation refuses, or the runner lmdeploy builds
        activate("ascend")
        _build_ascend_runner()
    assert type(info.value) is kind
    assert message in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_the_demo_prints_each_as_one_line_and_exits_2(tmp_path):
    pytest.importorskip("vendor_graph_sim", reason="the demo comes with the simulator package")
    for env, _, message in _cases(tmp_path):
        proc = subprocess.run([sys.executable, "-m", "vendor_graph", "demo", "--model", "tiny", "--steps", "2",
                               "--seqs", "2"], capture_output=True, text=True, timeout=300, env=_env(**env))
        assert proc.returncode == 2, (env, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith("vendor-graph demo: error: ") and message in proc.stderr, proc.stderr
        assert not (tmp_path / "s.json").exists()  # refused before anything ran: no stats file written


def _plan(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vendor_graph", "plan", "--vendor", SUPPORTED[0], *args],
                          capture_output=True, text=True, timeout=300, env=_env(**env))


def test_plan_shows_the_sizes_the_runtime_captures_under_the_setting():
    proc = _plan("--max-batches", "16", VENDOR_GRAPH_CAPTURE_SIZES="3,1,9")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ("Capture plan: max_batch_size 16, VENDOR_GRAPH_CAPTURE_SIZES (what the runtime captures): 4 graphs"
            in proc.stdout), proc.stdout
    assert ("note: VENDOR_GRAPH_CAPTURE_SIZES=3,1,9 normalised as lmdeploy does: sorted; max_batch_size 16 added "
            "(always captured)") in proc.stdout
    rows = [line.split()[0] for line in proc.stdout.split("graph batch", 1)[1].splitlines()[2:6]]
    assert rows == ["1", "3", "9", "16"], proc.stdout


def test_plan_refuses_what_the_runner_would_refuse_as_one_line():
    proc = _plan("--max-batches", "16", VENDOR_GRAPH_PLAN="auto")
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stdout + proc.stderr
    assert proc.stderr.startswith("vendor-graph plan: error: VENDOR_GRAPH_PLAN=auto needs VENDOR_GRAPH_STATS_FILE")
