"""The tiny decoder's demo (`vendor-graph demo --model tiny`), as a user runs it (its own process: the simulator is
process-global)."""

import json
import subprocess
import sys

from vendor_graph.upstream import compat


def test_demo_reports_parity_and_stats():
    vendor = compat.vendors_supporting(compat.installed_lmdeploy_version())[0]
    proc = subprocess.run([sys.executable, "-m", "vendor_graph", "demo", "--model", "tiny", "--vendor", vendor,
                           "--steps", "10", "--seqs", "5", "--generation", "G3b"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Parity with eager over 10 steps" in proc.stdout and ": PASS" in proc.stdout
    assert "not a device speed" in proc.stdout


DEMO_JSON_FIELDS = {"parity": bool, "steps": int, "graph_replays": int, "eager_steps": int, "vendor": str,
                    "backend": str, "lmdeploy": str, "generation": (str, type(None)), "seqlen_path": (str, type(None)),
                    "model": str, "dlinfer": (str, type(None))}


def test_demo_writes_its_verdict_and_counts_as_json(tmp_path):
    vendor = compat.vendors_supporting(compat.installed_lmdeploy_version())[0]
    path = tmp_path / "demo.json"
    path.write_text("an older run\n")
    proc = subprocess.run([sys.executable, "-m", "vendor_graph", "demo", "--model", "tiny", "--vendor", vendor,
                           "--steps", "7", "--seqs", "4", "--generation", "2.5.1", "--json", str(path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads(path.read_text())
    for name, kind in DEMO_JSON_FIELDS.items():
        assert isinstance(record[name], kind), (name, record)
    assert record["parity"] is True and record["steps"] == 7
    assert record["graph_replays"] + record["eager_steps"] + record["captures"] == 7
    assert record["vendor"] == vendor and record["backend"] == "sim" and record["model"] == "tiny"
    assert record["engine"] is False
    assert record["lmdeploy"] == str(compat.installed_lmdeploy_version())
    assert record["dlinfer"] is None  # the stand-in dlinfer
    if vendor == "ascend":
        assert record["generation"] == "G1" and record["torch_npu"] == "2.5.1"
        assert record["seqlen_path"] and record["seqlen_path"] in proc.stdout
    else:
        assert record["generation"] is None and record["seqlen_path"] is None
    assert [p.name for p in tmp_path.iterdir()] == ["demo.json"]  # no temporary file left behind


def test_demo_child_decision():
    from vendor_graph_sim.demo import demo_needs_child

    assert not demo_needs_child({"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
