"""A few fuzz cases as a user runs them: ``python -m vendor_graph`` in its own process (the console script's
path: interpreter start, the autoload hook, stdout a pipe), the demo for real, and the broken-pipe status."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from fuzz_harness import BOUND, EXAMPLES, SIGNAL_STATUSES, STATUSES, scaled, snapshot, workspace
from fuzz_strategies import JUNK, NUMBER_TEXT, VENDOR_WORDS
from hypothesis import given
from hypothesis import strategies as st

from vendor_graph.config import settings

DEMO_BOUND = 120.0  # seconds: the tiny decoder's demo at two steps takes a few
TRACEBACK = "Traceback (most recent call last)"


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in settings.SETTINGS and k != settings.SIM_SWITCH}
    return {**env, **(extra or {})}


def _run(argv: list[str], cwd, env=None, bound: float = 60.0) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "vendor_graph", *argv], cwd=cwd, env=_env(env), capture_output=True,
                          text=True, errors="replace", timeout=bound)
    assert done.returncode in STATUSES | SIGNAL_STATUSES, (argv, env, done.returncode, done.stderr[-3000:])
    assert TRACEBACK not in done.stderr, (argv, env, done.stderr[-3000:])
    if done.returncode == 2:
        assert done.stderr.strip().splitlines()[-1].startswith("vendor-graph"), (argv, done.stderr[-2000:])
    return done


WORDS = st.lists(st.one_of(JUNK, NUMBER_TEXT, VENDOR_WORDS, st.sampled_from(
    ["plan", "doctor", "paths", "run", "demo", "--from-stats", "good.json", "--max-batches", "--capture-sizes",
     "--json", "--vendor", "--", "true", "--steps", "--model"])).filter(lambda w: "\0" not in w), max_size=6)


@scaled(0.05, least=2)
@given(words=WORDS)
def test_generated_command_lines_in_their_own_process(tmp_path, words):
    folder = workspace(tmp_path)
    before = snapshot(folder)
    done = _run(words, folder)
    if done.returncode == 2:
        assert snapshot(folder) == before


def test_a_reader_that_goes_away_gets_the_broken_pipe_status(tmp_path):
    """`vendor-graph paths | head -1`: the reader closes the pipe; the writer stops quietly (141, or 0 if it had
    written everything first), never a BrokenPipeError traceback."""
    process = subprocess.Popen([sys.executable, "-m", "vendor_graph", "paths"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=_env(), cwd=tmp_path)
    process.stdout.readline()
    process.stdout.close()
    err = process.stderr.read().decode(errors="replace")
    status = process.wait(timeout=BOUND * 6)
    assert status in (0, 141), (status, err)
    assert TRACEBACK not in err, err


# The demo for real (the in-process cases stand in for its runs): settings that a runner reads only when it is
# built or while it runs. Each must end 0/1/2 without a traceback, and a refused one writes no --json file.
HOSTILE = [
    {"VENDOR_GRAPH_STATS_FILE": "stats.json", "VENDOR_GRAPH_STATS_EVERY": str(10**12)},
    {"VENDOR_GRAPH_STATS_FILE": "dir"},
    {"VENDOR_GRAPH_STATS_FILE": "missing/stats.json"},
    {"VENDOR_GRAPH_CAPTURE_SIZES": "100000"},
    {"VENDOR_GRAPH_PLAN": "auto"},
    {"VENDOR_GRAPH_PLAN": "auto", "VENDOR_GRAPH_STATS_FILE": "good.json", "VENDOR_GRAPH_CAPTURE_SIZES": "1,2"},
    {"VENDOR_GRAPH_PLAN": "auto", "VENDOR_GRAPH_STATS_FILE": "junk.json"},
    {"VENDOR_GRAPH_GRAPH_MEMORY": "9" * 40 + "GiB"},
    {"VENDOR_GRAPH_SHADOW": "1", "VENDOR_GRAPH_SHADOW_TOL": "1e308"},
]


# Each costs a demo run (seconds): the first three in every run, all of them with more examples asked for.
CHOSEN = HOSTILE if EXAMPLES >= 200 else HOSTILE[:3]


@pytest.mark.parametrize("env", CHOSEN, ids=[",".join(f"{k[13:]}={v[:12]}" for k, v in e.items()) for e in CHOSEN])
def test_the_demo_under_hostile_settings(tmp_path, env):
    vendor = "camb" if "VENDOR_GRAPH_PLAN" in env else "ascend"
    folder = workspace(tmp_path)
    before = snapshot(folder)
    done = _run(["demo", "--vendor", vendor, "--model", "tiny", "--steps", "2", "--seqs", "2", "--json", "out.json"],
                folder, env, bound=DEMO_BOUND)
    if done.returncode == 2:
        assert snapshot(folder) == before, "a refused demo wrote a file"
    else:
        assert (folder / "out.json").is_file(), done.stdout[-2000:]


@pytest.mark.parametrize("argv", [["demo", "--steps", "0", "--json", "out.json"],
                                  ["demo", "--model", "tiny", "--seqs", "100000", "--json", "out.json"],
                                  ["plan", "--from-stats", "junk.json", "--json"]])
def test_a_refused_command_writes_nothing(tmp_path, argv):
    folder = workspace(tmp_path)
    before = snapshot(folder)
    done = _run(argv, folder)
    assert done.returncode == 2, done.stderr
    assert snapshot(folder) == before
