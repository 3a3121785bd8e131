"""The real stack on the simulated NPU: lmdeploy's own Llama and DeepSeek-V2 (MLA) models, lmdeploy's Ascend
op backend and kernels, the real dlinfer, down to the emulated torch_npu ops, eager (``eager_mode=True``)
against graph mode with vendor_graph active, one process per torch_npu generation.

dlinfer comes from ``VENDOR_GRAPH_DLINFER_SRC`` or an installed ``dlinfer``; with neither, every test here
skips saying how to provide it. A setting given but unusable fails them (never a green skip).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from vendor_graph_sim import realstack

from vendor_graph.vendors.ascend import releases
from vendor_graph.vendors.ascend.seqlen import FIA, PAGED_ATTENTION_MLA, path_for

GENERATIONS = tuple(os.environ.get("VENDOR_GRAPH_REAL_STACK_GENERATIONS", " ".join(releases.GENERATIONS)).split())
STEPS = 14


def _run(generation: str, tmp_path, *models: str) -> dict:
    out = tmp_path / f"{generation}.json"
    proc = subprocess.run([sys.executable, "-m", "vendor_graph_sim.realstack", generation, str(out), *models,
                           "--steps", str(STEPS)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def expected_path(generation: str, model: str) -> str:
    """The seq-len path vendor_graph's table gives this generation's decode attention (dlinfer main: FIA
    for GQA, ATB paged MLA attention for MLA)."""
    facts = releases.GENERATION_FACTS[generation]
    return path_for(facts, FIA if model == "lmdeploy-llama" else PAGED_ATTENTION_MLA)


@pytest.mark.parametrize("generation", GENERATIONS)
def test_lmdeploy_models_decode_in_graph_mode_identically_to_eager(generation, tmp_path, dlinfer_available):
    result = _run(generation, tmp_path)
    if not releases.GENERATION_FACTS[generation]["graph_api"]:
        # dlinfer main's pins admit the G0 wheels, but its graph module's annotations name
        # torch.npu.ExternalEvent, which they lack: dlinfer (and so lmdeploy's Ascend backend) cannot import.
        error = result.get("dlinfer_import_error") or ""
        assert "ExternalEvent" in error and "ascend_cudagraph.py" in error, result
        return
    assert result.get("dlinfer_import_error") is None, result["dlinfer_import_error"]
    assert result["dlinfer"].startswith("dlinfer ")
    by_model = {r["model"]: r for r in result["records"]}
    assert set(by_model) == set(realstack.MODELS)
    for model, r in by_model.items():
        assert r["parity"], f"{model} on {generation}: {r['mismatches'][:5]}"
        assert r["steps"] == STEPS and r["tokens"] > STEPS
        assert r["graph_replays"] > 0, f"{model} on {generation}: no graph replayed ({r['eager_reasons']})"
        # prefill steps run eager, through lmdeploy's prefill (on 0.18 across vendor_graph's prefill-attention bridge)
        assert set(r["eager_reasons"]) <= {"not a decode step"}, f"{model} on {generation}: {r['eager_reasons']}"
        assert r["prefill"] == "prefill" and r["eager_steps"] > 0, r
        assert r["seqlen_paths"] == [expected_path(generation, model)]


MOE_PROBE = """
import json, sys, torch
from vendor_graph import vendors
from vendor_graph.vendors.ascend import hook
from vendor_graph.vendors.ascend.seqlen import detect
from vendor_graph_sim import device as sim, realstack
sim.install()
with sim.use_torch_npu("G1") as torch_npu:
    realstack.import_dlinfer()
    vendors.activate("ascend")
    from dlinfer.vendor.ascend import moe
    taken = []
    moe.MAX_GROUP_LIST_SIZE = 2  # four experts: more than one grouped matmul takes
    moe._apply_mlp_chunked_eager = lambda *a, **k: taken.append("eager (host sync)")
    moe._apply_mlp_chunked_capturable = lambda *a, **k: taken.append("capturable")
    args = (torch.zeros(3, 8), torch.zeros(4, 8, 16), torch.zeros(4, 8, 8), torch.tensor([1, 0, 2, 0]))
    moe.apply_mlp(*args)
    scope = hook.CaptureScope(npu=torch.npu, capabilities=detect(torch.npu, torch_npu.__version__),
                              stream=torch.npu.current_stream())
    with scope:
        moe.apply_mlp(*args)
    print(json.dumps(taken))
"""


def test_dlinfers_moe_for_many_experts_takes_its_capturable_path_under_a_vendor_graph_capture(dlinfer_available):
    proc = subprocess.run([sys.executable, "-c", MOE_PROBE], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["eager (host sync)", "capturable"]


GATE_PROBE = """
import json, sys, types, torch
from vendor_graph import vendors
from vendor_graph_sim import device as sim, realstack
sim.install()
with sim.use_torch_npu("G1"):
    realstack.import_dlinfer()  # dlinfer's ascend_cudagraph replaces four CudaGraphMixin methods
    vendors.activate("ascend")
    from lmdeploy.pytorch.model_inputs import StepContextManager, set_step_ctx_manager
    from lmdeploy.pytorch.models.utils.cudagraph import CudaGraphMixin
    mgr = StepContextManager()
    set_step_ctx_manager(mgr)
    mgr.set_context(types.SimpleNamespace(global_is_decoding=lambda: True))
    meta = types.SimpleNamespace(is_decoding=False, is_multi_token_decoding=True)
    fn = CudaGraphMixin.support_cuda_graph
    print(json.dumps([fn.__module__, fn(object(), None, None, None, attn_metadata=meta)]))
"""


def test_multi_token_decode_graphs_are_not_refused_by_dlinfers_version_gate(dlinfer_available):
    """dlinfer's support_cuda_graph refuses multi-token decode graphs below torch_npu 2.8.0.post1 (and caches its
    first answer for the process); vendor_graph re-asserts lmdeploy's rule and leaves the keys to its runner."""
    proc = subprocess.run([sys.executable, "-c", GATE_PROBE], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["vendor_graph.ascend", True]


def _demo(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vendor_graph", "demo", *args], capture_output=True, text=True,
                          timeout=600, env=env)


def test_an_unusable_dlinfer_setting_is_refused_naming_the_fix(tmp_path):
    env = dict(os.environ, VENDOR_GRAPH_DLINFER_SRC=str(tmp_path / "nowhere"))
    proc = _demo("--model", "lmdeploy-mla", env=env)
    assert proc.returncode == 2
    assert "VENDOR_GRAPH_DLINFER_SRC" in proc.stderr and "dlinfer/__init__.py" in proc.stderr
