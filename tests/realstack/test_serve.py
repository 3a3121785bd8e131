"""lmdeploy's real OpenAI server under vendor_graph on the simulated NPU, driven by the real ``openai`` client.

One server pair on lmdeploy 0.16 and one on 0.18, on G5 (:mod:`vendor_graph_sim.serve`): ``vendor-graph run
--vendor ascend -- lmdeploy serve api_server ...`` in graph mode, then with ``--eager-mode``, each a real
subprocess group on a free loopback port, each sent the same workload by 6 concurrent clients (12 requests: chat
completions and completions, streamed and not, greedy with ``ignore_eos``, prompts of 3 to 37 words, 8 to 41 new
tokens, ``--max-batch-size`` 4 so requests queue), then stopped with SIGTERM. The graph server also gets the bad
requests, each followed by a good one. The tests below share that one pair (a module fixture): their names carry
``engine_serves`` so that ``scripts/test.sh``'s selection of the real-stack tests for the leg's G5 part
(``-k ... engine_serves ...``) takes them wherever G5 runs.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import warnings

import pytest
from engine_checks import FULL, GENERATIONS, RELEASE, RUNNERS
from vendor_graph_sim import engine, serve

from vendor_graph.upstream import compat

SERVER_RELEASES = ("0.16", "0.18")  # the last release and the oldest (0.17's server is 0.18's): CI time
# Camb and MACA serve on the last release only: the server around the engine is the same code for every vendor, and
# their engines run on every release in test_engine.py
SERVER_VENDORS = ["ascend"] + [v for v in ("camb", "maca") if RELEASE == SERVER_RELEASES[-1]
                               and RELEASE in compat.SUPPORTED_SERIES[v]]
# What lmdeploy 0.16 and 0.18's server answer (observed, the same in both): a model it does not serve is a 404,
# the rest 400, each with an error body.
BAD_REQUEST_STATUS = {"unknown model": 404, "max_tokens 0": 400, "max_tokens negative": 400,
                      "prompt longer than the session": 400, "malformed JSON": 400}

def on_full(test):
    test = pytest.mark.skipif(RELEASE not in SERVER_RELEASES, reason=f"the server pair runs on {SERVER_RELEASES}")(test)
    return pytest.mark.skipif(FULL not in GENERATIONS, reason=f"runs in the part of this leg that runs {FULL}")(test)


@pytest.fixture(scope="module", params=SERVER_VENDORS)
def pair(request, tmp_path_factory, dlinfer_available):
    """The graph-mode and the eager server of each vendor (``--device``, ``vendor-graph run --vendor`` and the
    simulator switch), each started, sent the workload and stopped (the graph one also the bad requests)."""
    for module in ("openai", "requests", "fastapi", "uvicorn", "partial_json_parser"):
        if importlib.util.find_spec(module) is None:
            pytest.fail(f"{module} is not installed: lmdeploy's server and its client come with "
                        f"requirements/lmdeploy-imports.txt, which scripts/setup-test-env.sh installs")
    # the conftest's stand-in dlinfer (PYTHONPATH) must not shadow the real one in the server's processes
    env = {k: v for k, v in os.environ.items() if k not in ("VENDOR_GRAPH_VENDOR", "PYTHONPATH")}
    env["OMP_NUM_THREADS"] = "1"
    workdir = tmp_path_factory.mktemp("serve")  # the servers' logs and stats files, and the record (pair.json)
    vendor = request.param
    pair = serve.compare(workdir=workdir, generation=FULL if vendor == "ascend" else vendor, probes=True,
                         environ=env)
    (workdir / "pair.json").write_text(json.dumps(dataclasses.asdict(pair), indent=1))
    for run in (pair.graph, pair.eager):
        for why in run.restarts:  # lmdeploy's start-up race (serve.STARTUP_RACE) or a port taken: shown, not failed
            warnings.warn(f"the {run.mode} server was started again: {why}", stacklevel=1)
    return pair


@on_full
def test_api_server_engine_serves_the_same_answers_in_graph_mode_as_eager(pair):
    calls = serve.workload()
    for run in (pair.graph, pair.eager):
        assert [a.status for a in run.answers] == [200] * len(calls), [(a.index, a.error) for a in run.answers]
        assert [a.finish_reason for a in run.answers] == ["length"] * len(calls)
        assert [a.completion_tokens for a in run.answers] == [c.max_tokens for c in calls]
        for answer in run.answers:
            assert answer.text.strip(), answer
            if answer.endpoint == "chat":  # token ids: lmdeploy's return_token_ids, streamed or not
                assert len(answer.token_ids) == answer.max_tokens, answer
        assert run.most_concurrent > serve.MAX_BATCH_SIZE, "the clients never sent more than a batch at once"
    assert {(a.endpoint, a.stream) for a in pair.graph.answers} == set(serve.KINDS)
    assert pair.equal, "\n".join(pair.differences())


@on_full
def test_api_server_engine_serves_from_graphs_and_its_stats_file_is_complete_after_sigterm(pair):
    graph, eager = pair.graph.stats, pair.eager.stats
    assert pair.graph.stats_problem is None and pair.eager.stats_problem is None, (pair.graph.stats_problem,
                                                                                    pair.eager.stats_problem)
    assert graph["reason"] == "exit" and eager["reason"] == "exit"  # written by the engine process as it exited
    assert graph["runner"] == RUNNERS[serve.vendor_of(pair.graph.generation)]
    assert graph["max_batches"] == serve.MAX_BATCH_SIZE
    assert graph["captures"] > 0 and graph["replays"] > 0, graph
    # every decode step, warm-up's included, captured or replayed a graph; the only eager steps are prefills
    assert sum(graph["batch_histogram"].values()) == graph["captures"] + graph["replays"]
    assert set(graph["eager_steps"]) == {"not a decode step"}, graph["eager_steps"]
    # the decode batch moved across the buckets while serving
    replayed = {int(size) for size, bucket in graph["buckets"].items() if bucket["replays"]}
    assert len(replayed) >= 2 and max(replayed) == serve.MAX_BATCH_SIZE, graph["buckets"]
    assert len(graph["batch_histogram"]) >= 3, graph["batch_histogram"]
    assert eager["captures"] == 0 and eager["replays"] == 0, eager
    assert sum(eager["eager_steps"].values()) > 0
    # the engine served what the clients asked for: at least one decode step per new token beyond the first
    assert graph["decode_steps"] >= max(c.max_tokens for c in serve.workload()) - 1


@on_full
def test_api_server_engine_serves_http_errors_for_bad_requests_and_keeps_serving(pair):
    probes = pair.graph.probes
    assert {(p.case, p.endpoint) for p in probes} == {(c, e) for c in serve.PROBE_CASES
                                                       for e in ("chat", "completion")}
    for probe in probes:
        where = f"{probe.case} ({probe.endpoint}): {probe.message}"
        assert probe.status == BAD_REQUEST_STATUS[probe.case], where
        assert probe.alive, f"the server died on {where}"
        assert probe.after_status == 200 and probe.after_tokens == 4, f"after {where}: {probe.after_error}"
    assert len({p.message for p in probes if p.case == "prompt longer than the session"}) == 1
    assert str(engine.SESSION_LEN) in next(p.message for p in probes if p.case == "prompt longer than the session")


@on_full
def test_api_server_engine_serves_until_sigterm_and_leaves_no_process(pair):
    for run in (pair.graph, pair.eager):
        down = run.shutdown
        assert down is not None and not down.strays, f"{run.mode}: left running after SIGTERM: {down.strays}"
        assert not down.forced, f"{run.mode}: did not stop within {serve.STOP_TIMEOUT:.0f} s of SIGTERM"
        # uvicorn shuts down gracefully, then ends by the signal it caught (lmdeploy 0.16 and 0.18 alike)
        assert down.returncode in (0, -signal.SIGTERM), (run.mode, down.returncode, run.log_tail)
        assert "Application shutdown complete" in run.log_tail, run.log_tail


def test_stop_finds_and_kills_what_sigterm_leaves_in_the_servers_group(tmp_path):
    """What the SIGTERM checks above rely on: a process of the group that outlives its leader is found (and then
    killed), and a group that stops cleanly leaves nothing."""
    out, err = tmp_path / "out", tmp_path / "err"

    def server(code: str) -> serve.Server:
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            process = subprocess.Popen([sys.executable, "-c", code], stdout=stdout, stderr=stderr,
                                       start_new_session=True)
        time.sleep(0.5)
        return serve.Server(process, [], 0, "m", True, tmp_path / "stats.json", out, err, time.monotonic())

    # the leader dies of SIGTERM; its child ignores it
    stray = server("import signal, subprocess, sys, time\n"
                   "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
                   "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
                   "time.sleep(60)")
    time.sleep(1.0)
    down = stray.stop(timeout=3)
    assert down.forced and len(down.strays) == 1 and "SIG_IGN" in down.strays[0], down
    assert serve.group_members(stray.process.pid) == []
    clean = server("import time; time.sleep(60)")
    down = clean.stop(timeout=10)
    assert not down.forced and down.strays == [] and down.returncode == -signal.SIGTERM, down


def test_the_startup_race_is_told_from_other_failures():
    race = ("Process mp_engine_proc:\nTraceback (most recent call last):\n  File \"/usr/lib/python3.11/multiprocessing/"
            "managers.py\", line 822, in _callmethod\n    kind, result = conn.recv()\nEOFError\n"
            "lmdeploy.pytorch.engine.mp_engine.zmq_rpc.RPCServerDeadError: PyTorch ZMQ engine process is not alive.")
    assert serve.startup_race(race)
    assert not serve.startup_race(race.replace("EOFError", "RuntimeError: can't allocate memory"))
