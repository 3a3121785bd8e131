"""Generated ``VENDOR_GRAPH_*`` environments against the settings parser and the commands that read them."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from fuzz_harness import BOUND, FUZZ, bounded, check, invoke, scaled, workspace
from fuzz_strategies import environments
from hypothesis import given
from hypothesis import strategies as st

from vendor_graph.config import settings

PATHS = ["good.json", "sizes.txt", "junk.json", "dir", "missing.json", "dir/new.json", "missing/new.json",
         "/proc/self/status", "/dev/null", "plain.txt"]
COMMANDS = [["doctor"], ["plan"], ["plan", "--vendor", "camb", "--max-batches", "12"], ["paths"],
            ["plan", "--from-stats", "good.json"], ["plan", "--from-stats", "good.json", "--json"],
            ["run", "--vendor", "ascend", "--", "true"], ["demo", "--model", "tiny", "--steps", "2", "--seqs", "2"],
            ["demo", "--json", "out.json"]]


def _usable(value: settings.Settings) -> None:
    """What a later consumer needs of a value the parser accepted: the stats writer waits stats_every minutes
    (threading's timeouts end at TIMEOUT_MAX seconds); a byte count is taken from the device's free memory (an int64
    on every allocator). The counts (shadow, guard_weights_every, the event budget, plan_max_graphs) and capture
    sizes are Python ints compared with counters and batch sizes: any size works (sizes above max_batch_size are
    dropped, as lmdeploy drops them)."""
    assert value.stats_every * 60 <= threading.TIMEOUT_MAX, value.stats_every
    if isinstance(value.graph_memory, int):
        assert value.graph_memory < 2**63, value.graph_memory
    for name in ("shadow", "guard_weights_every", "npu_event_budget", "plan_max_graphs"):
        number = getattr(value, name)
        assert number is None or type(number) is int, (name, number)
    assert all(type(size) is int and size >= 1 for size in value.capture_sizes or ()), value.capture_sizes
    if value.stats_file:  # written at exit: a file (PATH, or PATH.rank<N>) in a folder that exists
        path = Path(value.stats_file)
        assert not path.is_dir() and path.parent.is_dir(), value.stats_file


@FUZZ
@given(env=environments(PATHS))
def test_the_parser_accepts_or_names_the_variable(tmp_path, env, monkeypatch):
    monkeypatch.chdir(workspace(tmp_path))
    value, seconds = bounded(settings.parse, env)
    assert seconds < BOUND, (env, seconds)
    if isinstance(value, settings.SettingsError):
        assert set(value.names) <= set(env), (env, value)
        assert all(name in str(value) for name in value.names)
        return
    assert isinstance(value, settings.Settings), (env, value)
    _usable(value)
    readings, seconds = bounded(settings.readings, env)
    assert isinstance(readings, list) and seconds < BOUND, (env, readings)


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
@scaled(0.5, least=5)
@given(env=environments(PATHS))
def test_commands_under_generated_settings(tmp_path, command, env):
    check(invoke(command, env=env, cwd=workspace(tmp_path)))


@FUZZ
@given(env=st.dictionaries(st.sampled_from(sorted(settings.SETTINGS)), st.one_of(
    st.integers(), st.floats(), st.binary(max_size=4), st.booleans(), st.lists(st.integers(), max_size=2)),
    min_size=1, max_size=3))
def test_a_mapping_with_values_that_are_not_text_is_refused_by_name(env):
    """settings.parse(mapping) is API: a value that is not text is a TypeError naming its variable."""
    with pytest.raises(TypeError) as info:
        settings.parse(env)
    assert any(name in str(info.value) for name in env), str(info.value)
    assert "has no attribute" not in str(info.value)
