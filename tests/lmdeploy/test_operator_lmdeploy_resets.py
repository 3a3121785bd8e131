"""The stale-graph guard relies on lmdeploy resetting the graph runner where graphs go stale: on
sleep (caches and weights leave the device) and when a weight update finishes. This reads the
installed lmdeploy's ModelAgent source (importing it needs zmq and the engine's dependencies) and
fails on a release that stops doing so, which would leave only the guard's own checks (KV caches at
every replay, weights every VENDOR_GRAPH_GUARD_WEIGHTS_EVERY replays)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest


def _agent_methods() -> dict[str, ast.FunctionDef]:
    spec = importlib.util.find_spec("lmdeploy")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("lmdeploy is not installed")
    root = Path(next(iter(spec.submodule_search_locations)))
    path = root / "pytorch" / "engine" / "model_agent" / "agent.py"
    tree = ast.parse(path.read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "BaseModelAgent"]
    return {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _calls(fn: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value
            owner = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            out.add(f"{owner}.{node.func.attr}")
    return out


def test_reset_graph_runner_resets_the_runner():
    methods = _agent_methods()
    assert "patched_model.reset" in _calls(methods["reset_graph_runner"])


def test_sleep_and_distributed_weight_updates_reset_the_graph_runner():
    methods = _agent_methods()
    assert "self.reset_graph_runner" in _calls(methods["sleep"])
    # 0.17 resets inline; 0.16 and 0.18 through a helper (0.18: _finalize_updated_weights).
    helpers = [m for m in ("update_weights_from_distributed", "_finalize_updated_weights") if m in methods]
    assert any("self.reset_graph_runner" in _calls(methods[m]) for m in helpers)


def test_update_params_does_not_reset_upstream_so_vendor_graph_wraps_it():
    """The IPC weight update never resets the graph runner in 0.16-0.18 (vendor_graph.install.lifecycle's
    reason to exist); when a release starts doing so, this says the wrapper is redundant there."""
    calls = _calls(_agent_methods()["update_params"])
    assert "self.reset_graph_runner" not in calls and "self._finalize_updated_weights" not in calls


def test_the_wrapper_resets_once_a_weight_update_is_finished():
    from types import SimpleNamespace

    from vendor_graph.install.lifecycle import wrap_update_params

    class Agent:
        resets = 0

        def update_params(self, request):
            if getattr(request, "fail", False):
                raise RuntimeError("bad weights")
            return "ok"

        def reset_graph_runner(self):
            self.resets += 1

    Agent.update_params = wrap_update_params(Agent.update_params)
    assert wrap_update_params(Agent.update_params) is Agent.update_params  # idempotent
    agent = Agent()
    assert agent.update_params(SimpleNamespace(finished=False)) == "ok" and agent.resets == 0
    assert agent.update_params(SimpleNamespace(finished=True)) == "ok" and agent.resets == 1
    with pytest.raises(RuntimeError):
        agent.update_params(SimpleNamespace(finished=True, fail=True))
    assert agent.resets == 2  # partially replaced weights: the graphs go too


def test_wakeup_rebuilds_caches_after_the_reset_of_sleep():
    """wakeup() does not reset (sleep did); it builds a new cache engine, whose new KV tensors the
    guard would see at the next replay even if a runner had not been reset."""
    calls = _calls(_agent_methods()["wakeup"])
    assert "self.build_cache_engine" in calls and "self.reset_graph_runner" not in calls
