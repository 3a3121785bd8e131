"""Generated file contents (valid, truncated, deeply nested, huge, wrong-typed, non-UTF-8) for stats files,
capture-size files and plan inputs, read through the CLI, the settings and the planning API."""

from __future__ import annotations

import json

import pytest
from fuzz_harness import BOUND, FUZZ, bounded, check, invoke, scaled, workspace
from fuzz_strategies import capture_size_files, stats_files
from hypothesis import given
from hypothesis import strategies as st

from vendor_graph import vendors
from vendor_graph.config import settings
from vendor_graph.sizing import capacity, planning

PLAN_OPTIONS = st.lists(st.sampled_from([["--json"], ["--max-graphs", "3"], ["--max-graphs", "65536"],
                                         ["--capture-sizes", "4"], ["--capture-sizes", "1", "100000"]]),
                        max_size=2).map(lambda parts: [w for p in parts for w in p])


@FUZZ
@given(content=stats_files(), options=PLAN_OPTIONS, second=st.sampled_from([False, False, False, True]))
def test_plan_from_generated_stats_files(tmp_path, content, options, second):
    folder = workspace(tmp_path)
    (folder / "stats.json").write_bytes(content)
    files = ["stats.json", "good.json"] if second else ["stats.json"]
    result = check(invoke(["plan", "--from-stats", *files, *options], cwd=folder))
    if result.status == 0 and "--json" in options:  # the plan is a file VENDOR_GRAPH_CAPTURE_SIZES takes
        (folder / "plan.json").write_text(result.out)
        planned = settings.parse({"VENDOR_GRAPH_CAPTURE_SIZES": str(folder / "plan.json")}).capture_sizes
        assert list(planned) == json.loads(result.out)["capture_sizes"], result.out


@FUZZ
@given(content=stats_files())
def test_planning_reads_generated_stats_files(tmp_path, content):
    path = tmp_path / "stats.json"
    path.write_bytes(content)
    value, seconds = bounded(planning.load_workload, [path])
    assert seconds < BOUND, seconds
    assert isinstance(value, (planning.Workload, planning.PlanError)), repr(value)
    if isinstance(value, planning.Workload) and value.decode_steps:
        plan, seconds = bounded(planning.plan_for, value, len(value.capture_sizes), event_budget=None)
        assert seconds < BOUND, seconds
        assert isinstance(plan, (planning.Plan, planning.PlanError)), repr(plan)


@pytest.mark.parametrize("plan", ["off", "auto"])
@scaled(0.5, least=5)
@given(content=stats_files())
def test_settings_naming_generated_stats_files(tmp_path, plan, content):
    folder = workspace(tmp_path)
    (folder / "stats.json").write_bytes(content)
    env = {"VENDOR_GRAPH_STATS_FILE": str(folder / "stats.json"), "VENDOR_GRAPH_PLAN": plan}
    check(invoke(["doctor"], env=env, cwd=folder))
    current = settings.parse(env)
    value, seconds = bounded(capacity.resolve_capture_plan, "ascend", 16, [1, 2, 4, 8, 16], None, current=current,
                             quiet=True)
    assert seconds < BOUND, seconds
    assert isinstance(value, (capacity.CapturePlan, capacity.CapturePlanError)), repr(value)
    value, seconds = bounded(capacity.reservation, 16, current, spec=vendors.profile("ascend").spec)
    assert seconds < BOUND, seconds
    assert isinstance(value, (capacity.Reservation, capacity.CapturePlanError)), repr(value)


@FUZZ
@given(content=capture_size_files(), command=st.sampled_from([["doctor"], ["plan", "--max-batches", "64"],
                                                              ["plan", "--from-stats", "good.json"]]))
def test_generated_capture_size_files(tmp_path, content, command):
    folder = workspace(tmp_path)
    (folder / "sizes.json").write_bytes(content)
    env = {"VENDOR_GRAPH_CAPTURE_SIZES": str(folder / "sizes.json")}
    value, seconds = bounded(settings.parse, env)
    assert seconds < BOUND, seconds
    assert isinstance(value, (settings.Settings, settings.SettingsError)), repr(value)
    if isinstance(value, settings.Settings):
        assert all(type(s) is int and s >= 1 for s in value.capture_sizes), value.capture_sizes
    check(invoke(command, env=env, cwd=folder))
