"""`vendor-graph demo` as a user runs it (a child interpreter: the simulator switch is process-wide): by default
lmdeploy's own pipeline on the simulated Ascend NPU, eager against graph mode with vendor_graph.ascend (Camb and MACA
on their simulated devices the same way); without a dlinfer it says how to provide one.

The engine demo takes about half a minute: it runs once per test run (the newest lmdeploy's leg), shared with the
README sample's check (tests/default_demo.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import default_demo
import pytest
from once_per_run import newest_release_only

from vendor_graph.install import bridges
from vendor_graph.upstream import compat

pytestmark = newest_release_only

TINY_FIELDS = {"parity", "steps", "graph_replays", "eager_steps", "captures", "vendor", "backend", "lmdeploy",
               "generation", "torch_npu", "seqlen_path", "model", "dlinfer", "seqs", "seed", "vendor_graph"}
ENGINE_FIELDS = {"engine", "executor", "requests", "tokens_equal", "bridges"}


@pytest.fixture(scope="module")
def demo() -> default_demo.DemoRun:
    why = default_demo.dlinfer_missing()
    if why:
        pytest.skip(why)
    return default_demo.run()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vendor_graph", "demo", *args], capture_output=True, text=True,
                          timeout=300, env=env)


def _env(**changes: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VENDOR_GRAPH_")}
    return {**env, **changes}


def test_the_default_demo_serves_lmdeploys_pipeline_and_graph_mode_matches_eager(demo):
    assert demo.status == 0, demo.output[-4000:]
    record = demo.record
    assert record is not None and TINY_FIELDS | ENGINE_FIELDS <= set(record), record
    assert record["engine"] is True and record["executor"] == "uni" and record["model"] == "lmdeploy-llama"
    assert record["tokens_equal"] is True and record["parity"] is True and record["first_difference"] is None
    assert record["requests"] == 8 and record["tokens"] == sum(8 + 3 * i for i in range(8))
    assert (record["vendor"], record["backend"], record["generation"]) == ("ascend", "sim", "G5")
    assert record["dlinfer"].startswith("dlinfer 0.2.8 (source checkout ")


def test_vendor_graphs_runner_captured_and_replayed_every_decode_step(demo):
    record = demo.record
    assert record["runner"] == "vendor_graph.vendors.ascend.runner.AscendGraphRunner"
    assert record["captures"] == len(record["capture_sizes"]) and record["graph_replays"] > 0
    assert record["graph_replays"] + record["captures"] == record["steps"]  # no decode step ran eager
    assert set(record["eager_reasons"]) == {"not a decode step"}
    batches = {int(b) for b in record["batch_histogram"]}
    assert {1, max(record["capture_sizes"])} <= batches and len(batches) >= 3  # requests joined and finished
    assert record["seqlen_path"] == "graph-update"  # G5's FIA path in vendor_graph's table


def test_the_bridges_applied_are_listed(demo):
    names = demo.record["bridges"]
    assert names and set(names) <= set(bridges.NAMES), names
    assert "prefill-attention" in names  # lmdeploy 0.18's prefill calls over this dlinfer: every prefill fails
    for name in names:
        assert f"  {name}: " in demo.output


def test_the_output_says_what_happened_and_nothing_of_lmdeploys_chatter(demo):
    header = demo.output.splitlines()[0]
    assert header.startswith(f"vendor_graph 0.1.0 demo: lmdeploy {compat.installed_lmdeploy_version()}'s "
                             f"pipeline(device_type='ascend') on the simulated Ascend NPU, torch_npu 2.9.0.post9 "
                             f"(G5), dlinfer source checkout "), header
    for text in ("Greedy tokens of every request equal, graph mode vs eager: yes (8 requests, 148 tokens eager, "
                 "148 graph)",
                 "Runner lmdeploy built: vendor_graph.vendors.ascend.runner.AscendGraphRunner (vendor_graph's)",
                 "bucket  captures  replays", "eager steps: ", "decode steps per batch size: 1: ",
                 "seq-len update path: graph-update: ", "Bridges applied (vendor_graph.install.bridges): ",
                 "vendor_graph put its own back", "Request 0: ", "  -> ",
                 "the simulator is CPU emulation, not a device speed"):
        assert text in demo.output, text
    for chatter in (" - lmdeploy - INFO - ", "it/s]", "Loading weights", "Warming up", "Vocab type detection",
                    "WARNING vendor_graph", "Traceback"):
        assert chatter not in demo.output, chatter


def test_without_a_dlinfer_the_demo_says_how_to_provide_one():
    from vendor_graph_sim import standins

    spec = importlib.util.find_spec("dlinfer")
    if spec is not None and not standins.is_standin(spec.origin):
        pytest.skip(f"a real dlinfer is installed here ({spec.origin}): the demo would run on it")
    proc = _cli(env=_env())  # the suite's stand-in dlinfer stays on PYTHONPATH: the demo must not take it
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("vendor-graph demo: error: the engine demo runs lmdeploy's dlinfer backend over "
                                  "the real dlinfer")
    assert "VENDOR_GRAPH_DLINFER_SRC" in proc.stderr and "vendor-graph demo --model tiny" in proc.stderr


@pytest.mark.parametrize(("vendor", "runtime", "device"), [
    ("ascend", "torch_npu", "the simulated Ascend NPU"), ("camb", "torch_mlu", "the simulated Cambricon MLU"),
    ("maca", "mcoplib", "the simulated MetaX MACA device")])
def test_beside_a_real_runtime_the_engine_demo_says_what_to_run_instead(tmp_path, vendor, runtime, device):
    """The simulated device never runs beside the vendor's real runtime, so lmdeploy's engine cannot be served on it
    here."""
    (tmp_path / runtime).mkdir()
    (tmp_path / runtime / "__init__.py").write_text(f"raise ImportError('the real {runtime} was imported')\n")
    env = _env(PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
               VENDOR_GRAPH_DLINFER_SRC=str(tmp_path / "unread"))  # refused if read: the runtime check comes first
    proc = _cli("--vendor", vendor, env=env)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr == (f"vendor-graph demo: error: a real {runtime} is installed ({tmp_path}/{runtime}/"
                           f"__init__.py): the engine demo serves lmdeploy on {device}, which never runs beside a real "
                           f"one; on this machine run lmdeploy itself after import vendor_graph.{vendor}, or "
                           f"vendor-graph demo --model tiny\n")


def test_camb_with_model_tiny_runs_the_tiny_decoder():
    proc = _cli("--vendor", "camb", "--model", "tiny", "--steps", "4", "--seqs", "3", env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0].startswith("vendor_graph 0.1.0 demo: vendor camb on the CPU graph simulator")
    assert "Parity with eager over 4 steps" in proc.stdout and ": PASS" in proc.stdout


@pytest.mark.parametrize("vendor", ["camb", "maca"])
def test_camb_and_maca_demos_serve_lmdeploys_pipeline_on_their_simulated_device(tmp_path, vendor):
    """`vendor-graph demo --vendor camb|maca`: lmdeploy's pipeline with device_type camb / maca, graph mode against
    eager, on lmdeploy's CUDA runner adopted by vendor_graph (about 10 s each)."""
    why = default_demo.dlinfer_missing()
    if why:
        pytest.skip(why)
    path = tmp_path / "demo.json"
    proc = _cli("--vendor", vendor, "--json", str(path),
                env=_env(VENDOR_GRAPH_DLINFER_SRC=str(default_demo.dlinfer_source()), OMP_NUM_THREADS="1",
                         PYTHONPATH=""))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads(path.read_text())
    assert record["vendor"] == vendor and record["engine"] is True and record["tokens_equal"] is True
    assert record["runner"] == "vendor_graph.runtime.adopted.VendorGraphCUDAGraphRunner"
    assert record["graph_replays"] > 0 and record["graph_replays"] + record["captures"] == record["steps"]
    assert record["generation"] is None and record["torch_npu"] is None
    assert f"pipeline(device_type='{vendor}')" in proc.stdout and "seq-len update: none needed" in proc.stdout


def test_model_tiny_is_the_tiny_decoders_demo_unchanged(tmp_path):
    path = tmp_path / "demo.json"
    proc = _cli("--model", "tiny", "--steps", "4", "--seqs", "3", "--json", str(path), env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("vendor_graph 0.1.0 demo: vendor ascend on the CPU graph simulator, simulated "
                                  "torch_npu G5, lmdeploy ")
    assert "Parity with eager over 4 steps (hidden states bitwise" in proc.stdout and ": PASS" in proc.stdout
    record = json.loads(path.read_text())
    assert set(record) == TINY_FIELDS | {"engine"} and record["engine"] is False and record["model"] == "tiny"


def test_beside_a_real_runtime_the_server_demo_names_the_server_command(tmp_path):
    (tmp_path / "torch_mlu").mkdir()
    (tmp_path / "torch_mlu" / "__init__.py").write_text("raise ImportError('the real torch_mlu was imported')\n")
    env = _env(PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    proc = _cli("--vendor", "camb", "--serve", env=env)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.endswith("on this machine run vendor-graph run --vendor camb -- lmdeploy serve api_server "
                                "<model> --device camb\n"), proc.stderr
