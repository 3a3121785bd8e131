"""``vendor-graph plan --from-stats``: capture sizes fitted to recorded stats, as text or as a sizes file."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from once_per_run import newest_release_only

from vendor_graph.config.settings import SizeList
from vendor_graph.install import patching
from vendor_graph.ops import cli

pytestmark = newest_release_only


def stats_file(tmp_path, name="stats.json", **fields):
    doc = {"format": "vendor_graph.stats/1", "vendor": "cuda", "rank": 0, "world_size": 1, "written_at": "now",
           "reason": "exit", "max_batches": 16, "capture_sizes": [1, 2, 4, 8, 16], "capture_source": "default",
           "num_layers": 4, "batch_histogram": {"3": 10, "6": 4, "12": 1}, "decode_steps": 15, "replays": 15,
           "captures": 5, "padded_fraction": 0.25, "graph_memory_bytes": None}
    doc.update(fields)
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def run(capsys, argv):
    status = cli.main(argv)
    out, err = capsys.readouterr()
    return status, out, err


def test_text_plan_shows_sizes_and_padding_before_and_after(capsys, tmp_path):
    path = stats_file(tmp_path)
    status, out, err = run(capsys, ["plan", "--from-stats", str(path), "--max-graphs", "3"])
    assert status == 0 and err == ""
    assert "plan from stats: vendor 'cuda', max_batches 16" in out
    assert f"read 1 file (15 decode steps, query lengths 1): {path}" in out
    assert "Fitted capture sizes: 3 graphs (at most 3)" in out
    assert "graph batch  serves batches  steps served  padded tokens" in out
    rows = [line.split() for line in out.splitlines() if line[:1].isdigit()]
    assert rows == [["3", "1-3", "10", "0"], ["6", "4-6", "4", "0"], ["16", "7-16", "1", "4"]]
    assert ("padded tokens: before 22 (25.0% of graph tokens, sizes [1, 2, 4, 8, 16]) -> after 4 (5.7%)"
            in out)
    assert patching.active() is None


def test_default_max_graphs_is_what_the_recorded_run_captured(capsys, tmp_path):
    path = stats_file(tmp_path, capture_sizes=[4, 16])
    status, out, _ = run(capsys, ["plan", "--from-stats", str(path), "--json"])
    plan = json.loads(out)
    # [6, 16] pads 3 x 10 + 4 x 1 tokens; [3, 16] would pad 10 x 4 + 4 x 1
    assert status == 0 and plan["max_graphs"] == 2 and plan["capture_sizes"] == [6, 16]


def test_json_is_one_object_and_a_capture_sizes_file(capsys, tmp_path):
    rank0 = stats_file(tmp_path, "s.rank0")
    rank1 = stats_file(tmp_path, "s.rank1", batch_histogram={"5": 3})
    status, out, err = run(capsys, ["plan", "--from-stats", str(rank0), str(rank1), "--max-graphs", "4",
                                    "--capture-sizes", "8", "--json"])
    assert status == 0 and err == ""
    plan = json.loads(out)
    assert plan["capture_sizes"] == [3, 6, 8, 16]
    for key in ("padded_fraction_before", "padded_fraction_after", "padded_tokens_before", "padded_tokens_after"):
        assert isinstance(plan[key], float)
    assert plan["padded_fraction_after"] < plan["padded_fraction_before"]
    assert plan["max_graphs"] == 4 and plan["vendor"] == "cuda" and plan["max_batches"] == 16
    assert plan["files"] == [str(rank0), str(rank1)] and plan["notes"] == []
    sizes_file = tmp_path / "sizes.json"
    sizes_file.write_text(out)
    assert SizeList().parse(str(sizes_file)) == tuple(plan["capture_sizes"])


def test_ascend_plan_carries_the_event_budget_note(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("VENDOR_GRAPH_NPU_EVENT_BUDGET", "8")
    path = stats_file(tmp_path, vendor="ascend")
    status, out, _ = run(capsys, ["plan", "--from-stats", str(path), "--max-graphs", "5"])
    assert status == 0
    assert "Fitted capture sizes: 2 graphs (at most 2)" in out
    assert "note: Ascend event budget allows at most 2 graphs for 4 layers" in out
    assert patching.active() is None


def test_from_stats_needs_neither_torch_nor_lmdeploy(tmp_path):
    path = stats_file(tmp_path)
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('torch', 'lmdeploy'):\n"
            "            raise ImportError('blocked ' + name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "from vendor_graph.ops import cli\n"
            f"sys.exit(cli.main(['plan', '--from-stats', {str(path)!r}, '--json']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["capture_sizes"]


@pytest.mark.parametrize("argv,expected", [
    (["plan", "--max-graphs", "4"], "vendor-graph plan: error: --max-graphs plans from recorded stats: give it "
                                    "with --from-stats FILE"),
    (["plan", "--json"], "vendor-graph plan: error: --json plans from recorded stats"),
    (["plan", "--from-stats", "{path}", "--vendor", "camb"], "--vendor cannot be given with --from-stats: the "
                                                             "stats files carry the vendor and max_batch_size"),
    (["plan", "--from-stats", "{path}", "--max-batches", "8"], "--max-batches cannot be given with --from-stats"),
    (["plan", "--from-stats", "{path}", "--max-graphs", "0"], "argument --max-graphs: 0: at least one graph"),
    (["plan", "--from-stats", "{path}", "--max-graphs", "1", "--capture-sizes", "4"],
     "2 sizes are required (4, 16, max_batches included) but max_graphs is 1"),
    (["plan", "--from-stats", "{path}", "--capture-sizes", "32"], "required size 32 is above max_batches 16"),
    (["plan", "--from-stats", "{tmp}/absent.json"], "absent.json: no such file; give a file written by vendor_graph"),
    (["plan", "--from-stats", "{bad}"], "bad.json: is not JSON"),
    (["plan", "--from-stats", "{path}", "{other}"], "has max_batches 16 but"),
], ids=range(10))
def test_usage_and_plan_errors_are_one_line(capsys, tmp_path, argv, expected):
    path = stats_file(tmp_path)
    other = stats_file(tmp_path, "other.json", max_batches=32)
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    argv = [a.format(path=path, other=other, bad=bad, tmp=tmp_path) for a in argv]
    status, out, err = run(capsys, argv)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("vendor-graph plan: error: ") and "Traceback" not in err
    assert expected in err, err
