"""benchmarks/capacity_engine.py and report_capacity.py without a GPU: ``h200.sh dry4`` (made-up results for every
part4 run, the real ``vendor-graph plan --from-stats`` on the made-up stats file, the report),
the report's verdicts computed from the numbers, and ``capacity_engine.py run`` itself against a stand-in for
lmdeploy's ``Engine`` (a child interpreter: streamed tokens, a registered runner with real ``GraphStats``, the real
``vendor_graph.ops.reports.write_stats_file``). Nothing is written into the repository's benchmarks/results/.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from vendor_graph.upstream import compat

NEWEST = max((s for series in compat.SUPPORTED_SERIES.values() for s in series), key=Version)
# The benchmark and its report do not depend on lmdeploy's release: once per test run, on the newest.
pytestmark = pytest.mark.skipif(compat.series(compat.installed_lmdeploy_version()) != NEWEST,
                                reason=f"runs once per test run, on lmdeploy {NEWEST}")

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
RESULTS = BENCH / "results"


def _stamp() -> dict:
    return {p.name: p.stat().st_mtime_ns for p in RESULTS.glob("capacity*")} if RESULTS.is_dir() else {}


@pytest.fixture(scope="module")
def dry(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dry4")
    before = _stamp()
    env = dict({k: v for k, v in os.environ.items() if not k.startswith("VENDOR_GRAPH_")}, OUT=str(out),
               PYTHON=sys.executable, OMP_NUM_THREADS="1")
    proc = subprocess.run(["bash", str(BENCH / "h200.sh"), "dry4"], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)
    logs = "\n".join(f"== {p.name}\n{p.read_text()[-1500:]}" for p in sorted(out.glob("dry_*.log")))
    assert proc.returncode == 0, proc.stdout + proc.stderr + logs
    assert "dry syntax: ok" in proc.stdout
    assert _stamp() == before, "dry4 wrote into benchmarks/results/"
    return out


def test_dry4_report_is_labelled_a_dry_run(dry):
    rep = json.loads((dry / "report" / "capacity.json").read_text())
    md = (dry / "report" / "capacity.md").read_text()
    assert rep["dry_run"] is True
    assert md.startswith("# DRY RUN") and "nothing was measured" in md
    a, b = rep["a"], rep["b"]
    assert [r["round"] for r in a["rounds"]] == [1, 2, 3]
    assert a["decode_tok_s_ratio"]["n"] == 3 and a["tpot_ratio"]["n"] == 3
    assert all(r["tokens"]["all_equal"] for r in a["rounds"])
    # the plan came from vendor_graph's own planner and is as good as the independent optimum
    assert a["plan"]["fallback"] is False
    assert a["plan"]["independent"]["plan_is_optimal"] is True
    assert a["auto_r1"]["status"] == "PASS"
    assert b["outcome"]["status"] == "SHOWN"
    assert b["reserved"]["reserved_bytes"] > 0 and not b["off"]["reserved_bytes"]


def test_goal_and_checks_follow_the_numbers(dry, tmp_path):
    res = tmp_path / "results"
    shutil.copytree(dry / "results", res)
    sys.path.insert(0, str(BENCH))
    try:
        import report_capacity as rc
    finally:
        sys.path.remove(str(BENCH))
    fake_padded = rc.report(res)["a"]["padded_fraction_fitted"]["median"]
    assert rc.report(res)["a"]["goal"]["status"] == ("PASS" if fake_padded <= rc.GOAL_PADDED else "MISS")
    for r in (1, 2, 3):  # fitted padding under the goal in every round
        path = res / f"fitted_r{r}.json"
        doc = json.loads(path.read_text())
        doc["vendor_graph"]["workload"]["padded_fraction"] = 0.08
        path.write_text(json.dumps(doc))
    assert rc.report(res)["a"]["goal"]["status"] == "PASS"
    doc = json.loads((res / "fitted_r2.json").read_text())  # one round with more graphs than the default
    doc["vendor_graph"]["graphs"] = 8
    doc["tokens"][5] = doc["tokens"][5][:3] + [1] + doc["tokens"][5][4:]
    (res / "fitted_r2.json").write_text(json.dumps(doc))
    rep = rc.report(res)["a"]
    assert rep["goal"]["status"] == "MISS" and rep["goal"]["met_rounds"] == 2
    assert rep["rounds"][1]["tokens"]["mismatched"] == {"5": {"first_diff_at": 3, "lengths": [
        len(doc["tokens"][5])] * 2}}
    auto = json.loads((res / "auto_r1.json").read_text())
    auto["vendor_graph"]["capture_sizes"] = [1, 2, 4, 8, 16, 32, 64]
    (res / "auto_r1.json").write_text(json.dumps(auto))
    assert rc.report(res)["a"]["auto_r1"]["status"] == "MISS"
    on = json.loads((res / "oom_reserved.json").read_text())
    on["vendor_graph"]["capture_failures"] = 1
    (res / "oom_reserved.json").write_text(json.dumps(on))
    assert rc.report(res)["b"]["outcome"]["status"] == "NOT SHOWN"
    out = tmp_path / "report"
    assert rc.main([str(res), "--out-dir", str(out)]) == 0
    assert (out / "capacity.md").read_text().startswith("# DRY RUN")


def test_plan_fallback_when_the_plan_command_gave_nothing(dry, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text("")
    proc = subprocess.run([sys.executable, str(BENCH / "capacity_engine.py"), "ensure-plan",
                           str(dry / "results" / "stats_default_r1.json"), str(plan)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(plan.read_text())
    want = json.loads((dry / "results" / "plan.json").read_text())
    assert got["fallback"] is True and got["capture_sizes"][-1] == 64 and len(got["capture_sizes"]) <= 7
    assert got["padded_fraction_after"] == pytest.approx(want["padded_fraction_after"])


# -- capacity_engine.py run, against a stand-in engine ---------------------------------------------------------

CHILD = r"""
import asyncio, os, sys, types
from types import SimpleNamespace
sys.path.insert(0, BENCH)
sys.modules["vendor_graph.cuda"] = types.ModuleType("vendor_graph.cuda")  # `import vendor_graph.cuda`: a no-op here
from vendor_graph.runtime import counters as vg_counters

class GenerationConfig:
    def __init__(self, **kw):
        self.__dict__.update(kw)

class PytorchEngineConfig:
    def __init__(self, **kw):
        self.__dict__.update(kw)
        assert 0 < self.cache_max_entry_count < 1, "invalid cache_max_entry_count"  # as lmdeploy asserts

class Runner:
    label, vendor = "vendor_graph.cuda", "cuda"
    def __init__(self, sizes):
        self.sizes, self.stats = sizes, vg_counters.GraphStats()
        for s in sizes:
            self.stats.captured(s, 0.01, 1 << 20)
        vg_counters.register(self)
    def capture_sizes(self):
        return list(self.sizes)
    def eager_reasons(self):
        return {}
    def graphs(self):
        return {s: None for s in self.sizes}

class Instance:
    def __init__(self, engine):
        self.engine = engine
    async def async_stream_infer(self, session_id, ids, gen_config=None):
        q = asyncio.Queue()
        self.engine.active[session_id] = [q, gen_config.max_new_tokens, ids, 0]
        while True:
            item = await q.get()
            if item is None:
                yield SimpleNamespace(token_ids=[], status="ResponseType.FINISH")
                return
            yield SimpleNamespace(token_ids=[item], status="ResponseType.SUCCESS")

class Engine:
    def __init__(self, cfg):
        if os.environ.get("FAKE_ENGINE_FAIL"):
            raise SystemExit(1)
        self.cache_config = SimpleNamespace(num_gpu_blocks=321, block_size=64, max_batches=cfg.max_batch_size,
                                            max_prefill_token_num=getattr(cfg, "max_prefill_token_num", 8192),
                                            cache_max_entry_count=cfg.cache_max_entry_count)
        sizes = [1, 2, 4, 8, 16, 32, 64]
        self.runner = Runner(sizes)
        self.active = {}
    @classmethod
    def from_pretrained(cls, path, engine_config=None):
        return cls(engine_config)
    def create_instance(self):
        return Instance(self)
    def start_loop(self):
        asyncio.get_event_loop().create_task(self.loop())
    async def loop(self):
        while True:
            await asyncio.sleep(0.002)
            running = [v for v in self.active.values() if v[3] < v[1]]
            if not running:
                continue
            b = len(running)
            size = next(s for s in self.runner.sizes if s >= b)
            self.runner.stats.decoded(b, 1)
            self.runner.stats.replayed(size, b, size)
            for v in running:
                v[0].put_nowait(v[2][v[3] % len(v[2])])
                v[3] += 1
                if v[3] == v[1]:
                    v[0].put_nowait(None)

lm = types.ModuleType("lmdeploy"); lm.GenerationConfig, lm.PytorchEngineConfig, lm.__version__ = (
    GenerationConfig, PytorchEngineConfig, "0.18.0-standin")
eng = types.ModuleType("lmdeploy.pytorch.engine"); eng.Engine = Engine
sys.modules.update({"lmdeploy": lm, "lmdeploy.pytorch": types.ModuleType("lmdeploy.pytorch"),
                    "lmdeploy.pytorch.engine": eng})
import capacity_engine
sys.exit(capacity_engine.cli(sys.argv[1:]))
"""


def _child(tmp_path: Path, args: list[str], **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("VENDOR_GRAPH_")}
    code = f"BENCH = {str(BENCH)!r}\n" + CHILD
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=dict(base, OMP_NUM_THREADS="1", **env))


def test_run_against_a_standin_engine(tmp_path):
    out, stats = tmp_path / "default_r1.json", tmp_path / "stats_default_r1.json"
    proc = _child(tmp_path, ["run", "default", str(tmp_path), str(out), "--label", "default_r1", "--round", "1"],
                  VENDOR_GRAPH_STATS_FILE=str(stats), VENDOR_GRAPH_GRAPH_MEMORY="off")
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["stage"] == "done" and doc["engine_built"] is True and doc["label"] == "default_r1"
    assert doc["env"] == {"VENDOR_GRAPH_GRAPH_MEMORY": "off", "VENDOR_GRAPH_STATS_FILE": str(stats)}
    assert doc["config"]["max_batch_size"] == 64 and doc["config"]["cache_max_entry_count"] == 0.1
    assert doc["engine"]["kv_blocks"] == 321
    w = doc["workload"]
    assert w["completed"] and w["requests_complete"] == w["requests"] == 96
    assert w["decode_tok_s"] > 0 and w["tpot_ms"] > 0 and w["tpot_requests"] > 0
    assert [len(t) for t in doc["tokens"]] == [r["output_len"] for r in doc["requests"]]
    vg = doc["vendor_graph"]
    assert vg["capture_sizes"] == [1, 2, 4, 8, 16, 32, 64] and vg["graphs"] == 7 and vg["graphs_captured"] == 7
    work = vg["workload"]
    # the measured workload only: the warm pass (8 x 24 tokens at batch 8) is left out
    assert sum(work["batch_histogram"].values()) == work["replays"]
    assert work["padded_fraction"] == pytest.approx(work["padding_from_histogram"]["padded_fraction"])
    assert 0 < work["padded_fraction"] < 1
    written = doc["stats_file"]
    assert written["path"] == str(stats) and stats.exists()
    sd = written["document"]
    assert sd["format"] == "vendor_graph.stats/1" and sd["vendor"] == "cuda" and sd["max_batches"] == 64
    assert sd["decode_steps"] > sum(work["batch_histogram"].values())  # the file holds the warm pass too
    assert vg["never_replayed"] == [s for s in vg["capture_sizes"] if not vg["buckets"][str(s)]["replays"]]
    # the plan command reads what the run wrote
    plan = subprocess.run([sys.executable, "-m", "vendor_graph", "plan", "--from-stats", str(stats), "--json"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["capture_sizes"][-1] == 64


def test_oom_engine_failure_is_recorded(tmp_path):
    out = tmp_path / "oom_off.json"
    proc = _child(tmp_path, ["run", "oom", str(tmp_path), str(out), "--label", "oom_off"], FAKE_ENGINE_FAIL="1",
                  VENDOR_GRAPH_GRAPH_MEMORY="off")
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["engine_built"] is False and doc["stage"] == "engine construction failed"
    assert "SystemExit" in doc["engine_error"] and "Traceback" in doc["traceback_tail"]
    assert doc["config"] == {"device_type": "cuda", "max_batch_size": 256, "cache_max_entry_count": 0.9999,
                             "max_prefill_token_num": 2048, "session_len": 4096, "dtype": "bfloat16"}
