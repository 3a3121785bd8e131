"""The two wheels a user installs: the runtime needs nothing of the clone, the simulator carries its data,
and `vendor-graph demo` runs from them in a directory outside the clone: the tiny decoder, and lmdeploy's engine
over the dlinfer snapshot (the MLA model on G1's task-update path: the clone's own run covers the default)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import default_demo
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
                           "--no-build-isolation", str(ROOT), str(ROOT / "sim"), "-w", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {w.name.split("-")[0]: w for w in out.glob("*.whl")}


def test_the_runtime_wheel_holds_the_runtime_and_the_worker_hook(wheels):
    names = zipfile.ZipFile(wheels["vendor_graph"]).namelist()
    assert "vendor_graph_autoload.pth" in names and "vendor_graph/autoload.pth" not in names
    assert "vendor_graph/vendors/ascend/runner.py" in names and "vendor_graph/runtime/step.py" in names
    assert not [n for n in names if n.startswith(("vendor_graph_sim", "tests/", "tools/"))]


def test_the_simulator_wheel_carries_its_data_and_the_demo(wheels):
    wheel = zipfile.ZipFile(wheels["vendor_graph_sim"])
    names = wheel.namelist()
    manifests = [n for n in names if n.startswith("vendor_graph_sim/data/torch_npu_manifests/")]
    assert len(manifests) == len(list((ROOT / "sim/vendor_graph_sim/data/torch_npu_manifests").glob("*.json")))
    assert "vendor_graph_sim/data/standins/dlinfer/__init__.py" in names
    entry_points = wheel.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "[vendor_graph.commands]\ndemo = vendor_graph_sim.demo:add_command" in entry_points
    assert ("[vendor_graph.variables]\nsimulator = vendor_graph_sim.variables:SIMULATOR\n"
            "test-harness = vendor_graph_sim.variables:TEST_HARNESS") in entry_points


def _from_the_wheels(wheels, tmp_path, argv: list[str], **env_changes: str) -> subprocess.CompletedProcess:
    site = tmp_path / "site"
    for wheel in wheels.values():
        zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("VENDOR_GRAPH_")}
    env["PYTHONPATH"] = str(site)  # ahead of this environment's editable installs
    env.update(env_changes)
    code = ("import sys, vendor_graph, vendor_graph_sim; from vendor_graph.ops.cli import main; "
            f"assert vendor_graph.__file__.startswith({str(site)!r}), vendor_graph.__file__; "
            f"assert vendor_graph_sim.__file__.startswith({str(site)!r}), vendor_graph_sim.__file__; "
            f"sys.exit(main({argv!r}))")
    return subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True,
                          timeout=600)


def test_the_tiny_demo_runs_from_the_unpacked_wheels_outside_the_clone(wheels, tmp_path):
    proc = _from_the_wheels(wheels, tmp_path, ["demo", "--model", "tiny", "--steps", "4", "--seqs", "3"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Parity with eager over 4 steps" in proc.stdout and ": PASS" in proc.stdout


def test_the_engine_demo_runs_from_the_unpacked_wheels_outside_the_clone(wheels, tmp_path):
    why = default_demo.dlinfer_missing()
    if why:
        pytest.skip(why)
    out = tmp_path / "demo.json"
    proc = _from_the_wheels(wheels, tmp_path, ["demo", "--model", "lmdeploy-mla", "--generation", "G1",
                                               "--requests", "5", "--json", str(out)],
                            VENDOR_GRAPH_DLINFER_SRC=default_demo.dlinfer_source())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert (record["engine"], record["model"], record["generation"]) == (True, "lmdeploy-mla", "G1")
    assert record["tokens_equal"] is True and record["requests"] == 5 and record["graph_replays"] > 0
    assert record["runner"] == "vendor_graph.vendors.ascend.runner.AscendGraphRunner"
    assert record["seqlen_path"] == "task-update"  # G1 has no NPUGraph.update: the captured tasks are updated
    assert "Greedy tokens of every request equal, graph mode vs eager: yes" in proc.stdout
