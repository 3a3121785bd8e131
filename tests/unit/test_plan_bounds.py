"""Planning's work is bounded: a stats file of tens of thousands of batch sizes, a huge --max-graphs or a
max_batches of 10**18 is capped (saying so) or refused (with the bound) within seconds, never planned for minutes;
and ``plan --from-stats`` refuses what it cannot use as one line, exit status 2."""

from __future__ import annotations

import json
import time

import pytest

from vendor_graph.ops import cli
from vendor_graph.sizing import planning
from vendor_graph.sizing.buckets import MAX_BATCHES_LIMIT
from vendor_graph.sizing.planning import SEARCH_LIMIT, PlanError

MANY = 40000  # distinct batch sizes: an exact fit into its default graph count searched for minutes


def _stats(path, **changes):
    doc = {"format": planning.STATS_FORMAT, "vendor": "camb", "max_batches": 64, "capture_sizes": [1, 2, 4, 8, 64],
           "batch_histogram": {"3": 10, "5": 4, "40": 2}}
    doc.update(changes)
    path.write_text(json.dumps(doc))
    return path


def _many(path, n=MANY, vendor="camb"):
    sizes = sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, *range(512, n, 256), n})
    return _stats(path, vendor=vendor, max_batches=n, capture_sizes=sizes,
                  batch_histogram={str(b): b % 7 + 1 for b in range(1, n + 1)})


def _cli(capsys, argv):
    status = cli.main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return status, out, err


def test_many_batch_sizes_with_the_default_graph_count_are_capped_with_a_note(tmp_path, capsys):
    path = _many(tmp_path / "many.json")
    start = time.perf_counter()
    status, out, err = _cli(capsys, ["plan", "--from-stats", str(path)])
    assert time.perf_counter() - start < 30
    assert status == 0, err
    cap = SEARCH_LIMIT // MANY
    assert (f"note: at most {cap} graphs fitted, not {len(json.loads(path.read_text())['capture_sizes'])}: an exact "
            f"fit of {MANY} distinct batch sizes searches {MANY} steps per graph, and vendor_graph bounds the search "
            f"at {SEARCH_LIMIT} steps") in out
    assert f"Fitted capture sizes: {cap} graphs (at most {cap})" in out


def test_a_max_graphs_covering_every_batch_needs_no_search(tmp_path, capsys):
    path = _many(tmp_path / "many.json")
    start = time.perf_counter()
    status, out, err = _cli(capsys, ["plan", "--from-stats", str(path), "--max-graphs", "100000", "--json"])
    assert time.perf_counter() - start < 30
    assert status == 0, err
    plan = json.loads(out)
    assert plan["capture_sizes"] == list(range(1, MANY + 1)) and plan["padded_tokens_after"] == 0


def test_a_max_graphs_just_below_every_batch_is_capped(tmp_path, capsys):
    path = _many(tmp_path / "many.json")
    status, out, err = _cli(capsys, ["plan", "--from-stats", str(path), "--max-graphs", str(MANY - 1)])
    assert status == 0, err
    assert f"note: at most {SEARCH_LIMIT // MANY} graphs fitted, not {MANY - 1}" in out


def test_fit_sizes_refuses_a_search_past_the_bound_and_answers_a_graph_per_batch_at_once():
    weights = {b: 1 for b in range(1, MANY + 1)}
    with pytest.raises(PlanError, match=rf"an exact fit of {MANY} distinct batch sizes into at most 1000 graphs takes "
                                        rf"{MANY * 1000} search steps, above vendor_graph's bound of {SEARCH_LIMIT}"):
        planning.fit_sizes(weights, MANY, 1000)
    assert planning.fit_sizes(weights, MANY, MANY) == list(range(1, MANY + 1))
    assert planning.fit_sizes({3: 5, 5: 1}, 8, 3) == [3, 5, 8]  # every candidate: no padding
    assert planning.search_cap(MANY, 10) == 10 and planning.search_cap(MANY, MANY) == MANY
    assert planning.search_cap(MANY, 1000) == SEARCH_LIMIT // MANY


def test_the_cap_refuses_when_the_required_sizes_do_not_fit_it(tmp_path):
    workload = planning.load_workload([_many(tmp_path / "many.json")])
    required = list(range(100, 100 + SEARCH_LIMIT // MANY + 1))
    with pytest.raises(PlanError, match="would search more than vendor_graph's bound"):
        planning.plan_for(workload, 1000, required, event_budget=None)


@pytest.mark.parametrize("changes,message", [
    ({"max_batches": 10**18, "capture_sizes": [10**18]},
     f"max_batches 1000000000000000000 is above {MAX_BATCHES_LIMIT}, vendor_graph's bound on max_batch_size"),
    ({"capture_sizes": [1, 10**18]}, f"is not a list of whole numbers from 1 to {MAX_BATCHES_LIMIT}"),
    ({"batch_histogram": {"3": 10**30}}, r"batch_histogram\['3'\] = 1000000000000000000000000000000 is not a step "
                                         r"count \(a whole number from 0 to 2\*\*63-1\)"),
    ({"batch_histogram": {"9" * 5000: 1}}, "is above 65536, vendor_graph's bound on max_batch_size"),
    ({"batch_histogram": {"3": 1}, "query_len_histogram": {"5000": {"3": 1}}}, "query length 5000 is above 1024"),
    ({"num_layers": 10**40}, r"num_layers 1000.*\.\.\..*000 is not a whole number from 0 to 2\*\*63-1"),
    ({"format": ["x" * 1000]}, r"format is \['xxxx.*\.\.\..*xxxx'\], not"),
])
def test_stats_values_past_what_a_run_records_are_refused(tmp_path, changes, message):
    path = _stats(tmp_path / "s.json", **changes)
    with pytest.raises(PlanError) as info:
        planning.read_stats(path)
    text = str(info.value)
    assert len(text) < 600 and "\n" not in text, text
    import re

    assert re.search(message, text), text


def test_plan_from_hostile_stats_files_exits_2_with_one_line(tmp_path, capsys):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    huge = _stats(tmp_path / "huge.json", max_batches=10**18, capture_sizes=[10**18])
    for path, message in ((deep, "nests arrays or objects more than 32 levels deep"),
                          (huge, "max_batches 1000000000000000000 is above 65536")):
        status, out, err = _cli(capsys, ["plan", "--from-stats", str(path)])
        assert status == 2 and out == "" and err.count("\n") == 1, err
        assert err.startswith(f"vendor-graph plan: error: {path}: ") and message in err, err


def test_a_repeated_capture_sizes_is_refused_not_replaced(tmp_path, capsys):
    path = _stats(tmp_path / "s.json")
    status, out, err = _cli(capsys, ["plan", "--from-stats", str(path), "--capture-sizes", "4", "8",
                                     "--capture-sizes", "16"])
    assert status == 2 and out == ""
    assert err == ("vendor-graph plan: error: --capture-sizes given twice (--capture-sizes 4 8 ... --capture-sizes "
                   "16); give it once with every size: --capture-sizes 4 8 16\n")
    status, out, err = _cli(capsys, ["plan", "--from-stats", str(path), "--capture-sizes", "4", "8", "--json"])
    assert status == 0 and {4, 8} <= set(json.loads(out)["capture_sizes"])
