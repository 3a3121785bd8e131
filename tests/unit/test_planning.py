"""vendor_graph.sizing.planning: the exact capture-size optimiser, stats files, and plans against recorded sizes."""

from __future__ import annotations

import itertools
import json
import random

import pytest
from once_per_run import newest_release_only

from vendor_graph.install import patching
from vendor_graph.sizing import planning
from vendor_graph.sizing.planning import PlanError, fit_sizes, load_workload, padded_fraction, padded_tokens, plan_for

pytestmark = newest_release_only


def brute_force(weights, max_batches, max_graphs, required=()):
    """Every allowed size set, ranked as fit_sizes ranks them: padding, then fewer sizes, then smaller sizes."""
    fixed = set(required) | {max_batches}
    free = [s for s in range(1, max_batches) if s not in fixed]
    best = None
    for extra in range(max_graphs - len(fixed) + 1):
        for chosen in itertools.combinations(free, extra):
            sizes = sorted(fixed | set(chosen))
            padding = sum(w * (next(s for s in sizes if s >= b) - b) for b, w in weights.items())
            key = (padding, len(sizes), sizes)
            if best is None or key < best:
                best = key
    return best[2]


def reference_padding(weights, max_batches, max_graphs):
    """The fewest padded tokens by the plain O(K^2 N) programme over sizes 1..max_batches."""
    inf = float("inf")
    cost = [[0.0] * (max_batches + 1) for _ in range(max_batches + 1)]
    for low in range(max_batches + 1):
        for size in range(low + 1, max_batches + 1):
            cost[low][size] = sum(weights.get(b, 0) * (size - b) for b in range(low + 1, size + 1))
    best = [cost[0][s] for s in range(max_batches + 1)]
    answer = best[max_batches]
    for _ in range(max_graphs - 1):
        best = [min([best[low] + cost[low][s] for low in range(1, s)] + [inf]) for s in range(max_batches + 1)]
        answer = min(answer, best[max_batches])
    return answer


def _random_case(rng):
    max_batches = rng.randint(1, 12)
    batches = rng.sample(range(1, max_batches + 1), rng.randint(1, max_batches))
    halves = rng.random() < 0.3
    weights = {b: (rng.randint(0, 40) / 2 if halves else rng.choice([0, 1, 1, 2, 3, 7, rng.randint(0, 100)]))
               for b in batches}
    if not any(weights.values()):
        weights[batches[0]] = 1
    required = set(rng.sample(range(1, max_batches + 1), rng.randint(1, min(3, max_batches)))) \
        if rng.random() < 0.35 else set()
    max_graphs = rng.randint(len(required | {max_batches}), max_batches + 1)
    return weights, max_batches, max_graphs, sorted(required)


def test_fit_sizes_equals_brute_force_on_random_histograms():
    rng = random.Random(20240611)
    for _ in range(300):
        weights, max_batches, max_graphs, required = _random_case(rng)
        got = fit_sizes(weights, max_batches, max_graphs, required)
        assert got == brute_force(weights, max_batches, max_graphs, required), (weights, max_batches, max_graphs,
                                                                                required)
        assert len(got) <= max_graphs and got[-1] == max_batches and set(required) <= set(got)


def test_fit_sizes_matches_the_plain_programme_on_larger_histograms():
    rng = random.Random(7)
    for _ in range(6):
        max_batches = rng.randint(40, 90)
        weights = {b: rng.randint(0, 50) for b in rng.sample(range(1, max_batches + 1), max_batches // 2)}
        max_graphs = rng.randint(2, 10)
        sizes = fit_sizes(weights, max_batches, max_graphs)
        assert padded_tokens(weights, sizes) == reference_padding(weights, max_batches, max_graphs)


def test_padded_tokens_and_fraction_by_hand():
    weights = {1: 10, 3: 4, 6: 2}
    # 1 -> 4 pads 3 x 10, 3 -> 4 pads 1 x 4, 6 -> 8 pads 2 x 2; graph tokens 4x10 + 4x4 + 8x2 = 72
    assert padded_tokens(weights, [8, 4]) == 38.0
    assert padded_fraction(weights, [4, 8]) == pytest.approx(38 / 72)
    assert padded_tokens(weights, [1, 3, 6]) == 0.0 and padded_fraction(weights, [1, 3, 6]) == 0.0
    assert padded_fraction({}, [4]) == 0.0 and padded_tokens({}, []) == 0.0
    assert padded_fraction({2: 0}, [4]) == 0.0
    assert padded_tokens({1: 0.5, 2: 1.5}, [2]) == 0.5


def test_a_batch_above_every_size_is_named():
    with pytest.raises(ValueError, match="batch 9 is above the largest capture size 8"):
        padded_tokens({3: 1, 9: 1}, [4, 8])
    with pytest.raises(ValueError, match="batch 3 is above every capture size"):
        padded_fraction({3: 1}, [])


def test_ties_prefer_fewer_sizes_then_smaller_ones():
    # [1, 3] and [2, 3] both pad one token: the smaller plan wins
    assert fit_sizes({1: 1, 2: 1, 3: 1}, 3, 2) == [1, 3]
    # a third size could only serve the zero-weight batch: not taken
    assert fit_sizes({1: 0, 4: 5}, 4, 3) == [4]
    assert fit_sizes({2: 3, 5: 0}, 8, 4) == [2, 8]
    # a required size is kept even when it serves nothing
    assert fit_sizes({2: 3}, 8, 4, required=[5]) == [2, 5, 8]
    assert fit_sizes({7: 1}, 8, 1) == [8]


def test_fit_sizes_is_deterministic_whatever_the_mapping_order():
    rng = random.Random(3)
    weights = {b: rng.randint(0, 9) for b in range(1, 30)}
    shuffled = dict(rng.sample(list(weights.items()), len(weights)))
    first = fit_sizes(weights, 32, 6, required=(4,))
    assert all(fit_sizes(shuffled, 32, 6, required=[4, 4]) == first for _ in range(3))


def test_large_histogram_gives_a_valid_plan():
    rng = random.Random(11)
    weights = {b: rng.randint(0, 1000) for b in range(1, 1025)}
    sizes = fit_sizes(weights, 1024, 40, required=[1, 512])
    assert len(sizes) == 40 and sizes == sorted(set(sizes)) and {1, 512, 1024} <= set(sizes)
    floats = {b: rng.random() * 100 for b in range(1, 1025)}
    assert len(fit_sizes(floats, 1024, 40)) == 40


@pytest.mark.parametrize("call,message", [
    (lambda: fit_sizes({}, 8, 2), "no decode steps"),
    (lambda: fit_sizes({3: 0, 4: 0}, 8, 2), "record a workload that decodes"),
    (lambda: fit_sizes({3: 1, 20: 1}, 8, 2), "batch 20 is above max_batches 8: the stats were recorded with a "
                                             "larger max_batch_size; plan with max_batches 20 or more"),
    (lambda: fit_sizes({3: 1}, 8, 0), "max_graphs 0: at least one graph (max_batches) is captured; give 1 or more"),
    (lambda: fit_sizes({3: 1}, 8, 2, required=[2, 4]), "3 sizes are required (2, 4, 8, max_batches included) but "
                                                      "max_graphs is 2; allow 3 or more graphs"),
    (lambda: fit_sizes({3: 1}, 8, 3, required=[9]), "required size 9 is above max_batches 8"),
    (lambda: fit_sizes({2.5: 1}, 8, 2), "batch 2.5 is not a whole number; batch sizes are whole numbers of 1"),
    (lambda: fit_sizes({0: 1}, 8, 2), "batch 0 is not positive"),
    (lambda: fit_sizes({3: 1}, 0, 2), "max_batches 0 is not positive"),
    (lambda: fit_sizes({3: 1}, 8, 2, required=[-1]), "required size -1 is not positive"),
    (lambda: fit_sizes({3: -2}, 8, 2), "batch 3: weight -2 is negative; give token counts"),
    (lambda: fit_sizes({3: float("nan")}, 8, 2), "is not a finite number"),
    (lambda: padded_tokens({3: 1}, ["4"]), "capture size '4' is not a whole number"),
], ids=range(13))
def test_errors_name_the_fix(call, message):
    with pytest.raises(PlanError) as info:
        call()
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


# -- stats files -------------------------------------------------------------------------------------------


def stats_doc(**fields):
    doc = {"format": "vendor_graph.stats/1", "vendor": "cuda", "rank": 0, "world_size": 1,
           "written_at": "2024-06-11T10:00:00", "reason": "exit", "max_batches": 16,
           "capture_sizes": [1, 2, 4, 8, 16], "capture_source": "default", "num_layers": 4,
           "batch_histogram": {"3": 10, "6": 4}, "decode_steps": 14, "replays": 14, "captures": 5,
           "padded_fraction": 0.2, "graph_memory_bytes": None, "reserved_graph_memory_bytes": None,
           "buckets": {}, "eager_steps": {}}
    doc.update(fields)
    return {k: v for k, v in doc.items() if v is not ...}


def write(tmp_path, name, doc):
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


@pytest.mark.parametrize("content,message", [
    ("{not json", "is not JSON"),
    ("[1, 2]", "holds a JSON list, not an object"),
    (stats_doc(format="something/2"), "format is 'something/2', not 'vendor_graph.stats/1'"),
    (stats_doc(format=...), "format is None"),
    (stats_doc(batch_histogram=..., max_batches=...), "lacks max_batches, batch_histogram"),
    (stats_doc(vendor="tpu"), "vendor 'tpu' is not one of cuda, ascend, camb, maca"),
    (stats_doc(max_batches="16"), "max_batches '16' is not a whole number"),
    (stats_doc(capture_sizes=[1, 0]), "capture_sizes [1, 0] is not a list of whole numbers"),
    (stats_doc(batch_histogram={"three": 2}), "batch_histogram key 'three' is not a batch size"),
    (stats_doc(batch_histogram={"0": 2}), "batch_histogram key '0' is not a batch size"),
    (stats_doc(batch_histogram={"3": -1}), "batch_histogram['3'] = -1 is not a step count"),
    (stats_doc(batch_histogram={"3": 1.5}), "batch_histogram['3'] = 1.5 is not a step count"),
    (stats_doc(batch_histogram=[3, 1]), "batch_histogram is list, not an object"),
    (stats_doc(query_len_histogram={"x": {}}), "query_len_histogram key 'x' is not a query length"),
    (stats_doc(query_len_histogram={"1": {"3": 10}}), "batch 6: query_len_histogram counts 0 steps, "
                                                      "batch_histogram 4"),
    (stats_doc(num_layers=-1), "num_layers -1 is not a whole number"),
], ids=range(16))
def test_bad_stats_files_name_the_path_and_the_fix(tmp_path, content, message):
    path = write(tmp_path, "stats.json", content)
    with pytest.raises(PlanError) as info:
        planning.read_stats(path)
    text = str(info.value)
    assert text.startswith(f"{path}: ") and message in text
    assert "VENDOR_GRAPH_STATS_FILE" in text


def test_missing_stats_file(tmp_path):
    with pytest.raises(PlanError, match="no such file; give a file written by vendor_graph"):
        planning.read_stats(tmp_path / "absent.json")
    with pytest.raises(PlanError, match="is a directory"):
        planning.read_stats(tmp_path)
    with pytest.raises(PlanError, match="no stats files given"):
        load_workload([])


def test_a_document_with_runners_is_read_from_its_top_level(tmp_path):
    doc = stats_doc(runners=[stats_doc(batch_histogram={"3": 10, "6": 4}), stats_doc(batch_histogram={"9": 99})])
    workload = load_workload([write(tmp_path, "s.json", doc)])
    assert workload.steps == {3: 10, 6: 4}


def test_one_file(tmp_path):
    path = write(tmp_path, "s.json", stats_doc())
    workload = load_workload([path])
    assert workload == planning.Workload(vendor="cuda", max_batches=16, capture_sizes=(1, 2, 4, 8, 16),
                                         steps={3: 10, 6: 4}, weights={3: 10, 6: 4}, query_lens=(1,), num_layers=4,
                                         files=(str(path),), graph_memory_bytes=None)
    assert workload.decode_steps == 14


def test_rank_files_are_summed(tmp_path):
    rank0 = write(tmp_path, "s.json.rank0", stats_doc(graph_memory_bytes=1000, num_layers=4))
    rank1 = write(tmp_path, "s.json.rank1", stats_doc(batch_histogram={"6": 1, "16": 2}, graph_memory_bytes=3000,
                                                       num_layers=8, capture_sizes=[16, 8, 4, 2, 1]))
    workload = load_workload([rank0, str(rank1)])
    assert workload.steps == {3: 10, 6: 5, 16: 2} and workload.weights == workload.steps
    assert workload.files == (str(rank0), str(rank1))
    assert workload.num_layers == 8 and workload.graph_memory_bytes == 3000


@pytest.mark.parametrize("key,value", [("vendor", "ascend"), ("max_batches", 32), ("capture_sizes", [4, 16])])
def test_files_of_different_deployments_are_refused(tmp_path, key, value):
    first = write(tmp_path, "a.json", stats_doc())
    second = write(tmp_path, "b.json", stats_doc(**{key: value}))
    with pytest.raises(PlanError) as info:
        load_workload([first, second])
    text = str(info.value)
    assert str(first) in text and str(second) in text and repr(value) in text and key in text
    assert "plan from files of one deployment" in text


def test_query_lengths_weight_the_tokens(tmp_path):
    doc = stats_doc(batch_histogram={"3": 10, "6": 4},
                    query_len_histogram={"1": {"3": 6, "6": 4}, "4": {"3": 4}, "2": {"6": 0}})
    plain = stats_doc(batch_histogram={"3": 1})
    workload = load_workload([write(tmp_path, "q.json", doc), write(tmp_path, "p.json", plain)])
    assert workload.steps == {3: 11, 6: 4}
    assert workload.weights == {3: 6 + 4 * 4 + 1, 6: 4}
    assert workload.query_lens == (1, 4)
    only_long = load_workload([write(tmp_path, "l.json", stats_doc(batch_histogram={"3": 2},
                                                                   query_len_histogram={"3": {"3": 2}}))])
    assert only_long.weights == {3: 6} and only_long.query_lens == (3,)


# -- plans -------------------------------------------------------------------------------------------------


def workload(**fields):
    base = dict(vendor="cuda", max_batches=16, capture_sizes=(1, 2, 4, 8, 16), steps={3: 10, 6: 4, 12: 1},
                weights={3: 10, 6: 4, 12: 1}, query_lens=(1,), num_layers=4, files=("s.json",))
    base.update(fields)
    return planning.Workload(**base)


def test_plan_compares_with_the_recorded_sizes():
    plan = plan_for(workload(), 3)
    assert plan.capture_sizes == [3, 6, 16]
    # before: 3 -> 4 pads 10, 6 -> 8 pads 8, 12 -> 16 pads 4; graph tokens 40 + 32 + 16
    assert plan.padded_tokens_before == 22.0 and plan.padded_fraction_before == pytest.approx(22 / 88)
    # after: 12 -> 16 pads 4; graph tokens 30 + 24 + 16
    assert plan.padded_tokens_after == 4.0 and plan.padded_fraction_after == pytest.approx(4 / 70)
    assert plan.max_graphs == 3 and plan.notes == ()
    assert plan_for(workload(), 5, required=[8]).capture_sizes == [3, 6, 8, 12, 16]


def test_plan_needs_steps_and_recorded_sizes_covering_them():
    with pytest.raises(PlanError, match="s.json: no decode steps recorded; run the workload longer"):
        plan_for(workload(steps={}, weights={}), 3)
    with pytest.raises(PlanError, match=r"batch 12 is above every recorded capture size \[1, 2, 4, 8\]"):
        plan_for(workload(capture_sizes=(1, 2, 4, 8)), 3)
    with pytest.raises(PlanError, match="max_graphs 0"):
        plan_for(workload(), 0)


def test_ascend_event_budget_caps_the_graphs():
    ascend = workload(vendor="ascend", num_layers=10, query_lens=(1, 2))
    plan = plan_for(ascend, 5, event_budget=45)  # 20 events per size: 2 fit
    assert plan.max_graphs == 2 and len(plan.capture_sizes) == 2 and plan.capture_sizes[-1] == 16
    assert plan.notes == ("Ascend event budget allows at most 2 graphs for 10 layers (20 ExternalEvents per size: "
                          "10 layers x 2 query lengths; budget 45, VENDOR_GRAPH_NPU_EVENT_BUDGET)",)
    assert plan_for(ascend, 5, event_budget=1000).max_graphs == 5
    assert plan_for(ascend, 5, event_budget=None).notes == ()
    assert plan_for(workload(num_layers=10, query_lens=(1, 2)), 5, event_budget=45).max_graphs == 5  # not Ascend
    with pytest.raises(PlanError, match="does not fit even one size: each needs 20"):
        plan_for(ascend, 5, event_budget=19)
    with pytest.raises(PlanError, match="fewer than the 3 sizes required"):
        plan_for(ascend, 5, required=[3, 6], event_budget=45)


def test_ascend_without_layers_is_not_capped_but_noted():
    plan = plan_for(workload(vendor="ascend", num_layers=0), 5, event_budget=10)
    assert plan.max_graphs == 5 and "do not record num_layers" in plan.notes[0]


def test_ascend_budget_from_the_environment(monkeypatch):
    monkeypatch.setenv("VENDOR_GRAPH_NPU_EVENT_BUDGET", "12")
    plan = plan_for(workload(vendor="ascend", num_layers=4), 5)
    assert plan.max_graphs == 3 and "budget 12" in plan.notes[0]
    assert patching.active() is None  # reading the Ascend limits activated nothing
