"""dlinfer after its PR #350 (commit ae9862a1: FIA-only Ascend attention, ``NPUGraph.update`` for every graph, a
runtime check at ``import dlinfer``) on the simulated NPU, beside dlinfer main a50184e that the other real-stack
tests run.

No whole snapshot of it exists: :func:`vendor_graph_sim.overlay.overlaid` lays the files that commit changed
(``../shared/third_party/dlinfer_pr350``) over a copy of the a50184e tree (the dlinfer of
``VENDOR_GRAPH_DLINFER_SRC``, else the snapshot beside the clone), and that copy is the dlinfer each child runs.
Its runtime check wants torch and torch_npu of one major.minor: torch here is 2.13, so the simulated torch_npu is
:data:`RELEASE` (G5). Llama runs through lmdeploy's pipeline, DeepSeek-V2 (MLA, whose decode is FIA v2 after #350)
step by step through the real stack. Release-independent in what it checks of vendor_graph: once per run, on the
last lmdeploy release, in the part of the real-stack leg that runs G5.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from engine_checks import FULL, GENERATIONS, check_pair
from engine_checks import RELEASE as LMDEPLOY
from once_per_run import newest_release_only
from vendor_graph_sim import overlay

from vendor_graph.vendors.ascend import dlinfer_adapter, releases
from vendor_graph.vendors.ascend.seqlen import FIA_V2, path_for

RELEASE = "2.13.0"  # torch 2.13's own torch_npu (G5): what post-#350 dlinfer's runtime check accepts here
REFUSED = {"G2a": "Unsupported torch-npu version", "2.12.0.post3": "must use the same major.minor"}
OURS = "vendor_graph.vendors.ascend.runner.AscendGraphRunner"
pytestmark = [newest_release_only,
              pytest.mark.skipif(FULL not in GENERATIONS, reason=f"runs in the part of this leg that runs {FULL}")]


@pytest.fixture(scope="module")
def post_350(dlinfer_available):
    """The overlaid tree's root (usable as ``VENDOR_GRAPH_DLINFER_SRC``)."""
    origin, root = dlinfer_available
    base = root if origin == "source" else overlay.default_base()
    if not (overlay.default_overlay() / "dlinfer").is_dir() or not (Path(base) / "dlinfer").is_dir():
        pytest.skip(f"no dlinfer PR #350 overlay ({overlay.default_overlay()}) or a50184e tree ({base}) here")
    said = []
    tree = overlay.overlaid(base, overlay.default_overlay(), say=said.append)
    assert said and "laid over a copy of" in said[0] and "dlinfer/vendor/ascend/version.py" in said[0], said
    print(said[0])
    return tree


def child_env(tree: Path, sim: str, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VENDOR_GRAPH_VENDOR", "PYTHONPATH")}
    env.update(VENDOR_GRAPH_SIM=sim, VENDOR_GRAPH_DLINFER_SRC=str(tree), OMP_NUM_THREADS="1", **extra)
    return env


PROBE = """
import json, sys
result = {}
try:
    import dlinfer.vendor.ascend  # runs dlinfer's ensure_ascend_runtime()
except RuntimeError as exc:
    result["refused"] = str(exc)
    print(json.dumps(result)); sys.exit(0)
import torch_npu
import vendor_graph.ascend  # noqa: F401  (activates; the adapter routes dlinfer's decode attention)
from dlinfer.framework.lmdeploy_ext.cudagraph import ascend_cudagraph
from dlinfer.vendor.ascend import attention
from vendor_graph.vendors.ascend import dlinfer_adapter, hook
found = dlinfer_adapter.dlinfer_generation()
result.update(torch_npu=torch_npu.__version__, generation=found.name, evidence=list(found.evidence),
              binds_runner="AscendGraphRunner" in attention.decode_attention.__globals__,
              routed=dlinfer_adapter.is_routed(attention.decode_attention))
original = attention.decode_attention.__wrapped__
flags = [dlinfer_adapter._dlinfer_capturing(original)]
class Scope:  # a vendor_graph capture in progress (the runner's CaptureScope records through call())
    def call(self, op, args, kwargs):
        return op(*args, **kwargs)
token = hook._SCOPE.set(Scope())
ascend_cudagraph.AscendGraphRunner.capturing = True  # what dlinfer's own runner sets while it captures
try:
    flags.append(dlinfer_adapter._dlinfer_capturing(original))
    try:
        attention.decode_attention(*([None] * 12))
        result["conflict"] = None
    except dlinfer_adapter.DlinferCaptureConflict as exc:
        result["conflict"] = str(exc)
    except Exception as exc:  # not refused: dlinfer's function ran on the probe's None arguments
        result["conflict"] = None
        result["ran"] = f"{type(exc).__name__}: {exc}"
finally:
    ascend_cudagraph.AscendGraphRunner.capturing = False
    hook._SCOPE.reset(token)
flags.append(dlinfer_adapter._dlinfer_capturing(original))
result["flags"] = flags
print(json.dumps(result))
"""


def probe(tree: Path, sim: str, tmp_path: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300,
                          env=child_env(tree, sim), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("sim", sorted(REFUSED))
def test_engine_dlinfers_pr350_refuses_torch_npu_its_runtime_check_rejects(post_350, tmp_path, sim):
    """G2a (2.6.0: below 2.8.0.post1) and 2.12.0.post3 (G5, but torch is 2.13): ``import dlinfer`` raises."""
    result = probe(post_350, sim, tmp_path)
    assert REFUSED[sim] in result.get("refused", ""), result
    adapter = dlinfer_adapter.DlinferGeneration(dlinfer_adapter.POST_350, str(post_350), ("overlay",))
    release = sim if sim not in releases.GENERATIONS else None
    if release is not None:  # vendor_graph's reading of the same rule agrees
        import torch

        assert adapter.refusal(torch.__version__, release) is not None


def test_engine_dlinfers_pr350_accepts_its_torch_npu_and_vendor_graph_sees_its_capture(post_350, tmp_path):
    """On torch_npu 2.13.0 dlinfer imports; the adapter names the post-#350 generation, and its conflict check
    reads dlinfer's capture flag on ascend_cudagraph (the attention module no longer binds AscendGraphRunner)."""
    result = probe(post_350, RELEASE, tmp_path)
    assert "refused" not in result, result
    assert result["torch_npu"] == RELEASE
    assert result["generation"] == dlinfer_adapter.POST_350, result["evidence"]
    assert result["routed"] and not result["binds_runner"], result
    assert result["flags"] == [False, True, False]
    assert "AscendGraphRunner.capturing is set during a vendor_graph capture" in (result["conflict"] or ""), result


def test_engine_dlinfers_pr350_serves_the_same_tokens_in_graph_mode_as_eager(post_350, tmp_path):
    """lmdeploy's pipeline, Llama, vendor_graph's runner over post-#350 dlinfer: greedy tokens equal eager's,
    every decode step captured or replayed a graph."""
    out = tmp_path / "engine.json"
    proc = subprocess.run([sys.executable, "-m", "vendor_graph_sim.engine", str(out), "--models", "lmdeploy-llama"],
                          capture_output=True, text=True, timeout=900, cwd=str(tmp_path),
                          env=child_env(post_350, RELEASE, VENDOR_GRAPH_STATS_FILE=str(tmp_path / "stats.json")))
    assert proc.returncode == 0 and out.is_file(), proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["runner"] == "vendor_graph" and result["torch_npu"] == RELEASE, result
    if LMDEPLOY == "0.18":  # its prefill call still does not fit (ae9862a1 did not change llm.prefill_attention)
        assert result["bridges"] == ["prefill-attention"], result["bridges"]
    (entry,) = result["results"]
    check_pair(entry, f"lmdeploy-llama on post-#350 dlinfer, torch_npu {RELEASE}")
    assert entry["graph"]["runner"] == OURS


MOE_PROBE = """
import json, sys, torch
from vendor_graph import vendors
from vendor_graph.vendors.ascend import hook
from vendor_graph.vendors.ascend.seqlen import detect
from vendor_graph_sim import device as sim, realstack
sim.install()
with sim.use_torch_npu(sys.argv[1]) as torch_npu:
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


def test_engine_dlinfers_pr350_moe_for_many_experts_takes_its_capturable_path_under_our_capture(post_350, tmp_path):
    """dlinfer's MoE module did not change in #350: vendor_graph's capture still selects its host-sync-free path."""
    env = {k: v for k, v in child_env(post_350, RELEASE).items() if k != "VENDOR_GRAPH_SIM"}
    proc = subprocess.run([sys.executable, "-c", MOE_PROBE, RELEASE], capture_output=True, text=True, timeout=300,
                          env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["eager (host sync)", "capturable"]


@pytest.mark.parametrize("sparse_mode", [0, 3])
def test_engine_dlinfers_pr350_prefill_layout_of_the_emulated_fia(sparse_mode):
    """post-#350 dlinfer prefills through FIA v1 in TND with packed (not paged) keys and cumulative
    ``actual_seq_lengths[_kv]`` (sparse_mode 0 without a mask, 3 with the compressed causal mask); eager and graph
    runs share this emulated kernel, so it is checked here against attention computed per sequence."""
    import torch
    from vendor_graph_sim import kernels  # noqa: F401  (registers the emulated operators)

    g = torch.Generator().manual_seed(0)
    lens, heads, kv_heads, dim, rope = [3, 5], 4, 2, 8, 4
    q, k, v = (torch.randn(sum(lens), h, dim, generator=g) for h in (heads, kv_heads, kv_heads))
    q_rope = torch.randn(sum(lens), heads, rope, generator=g)
    k_rope = torch.randn(sum(lens), kv_heads, rope, generator=g)
    ends = torch.tensor(lens).cumsum(0).tolist()
    mask = torch.ones(2048, 2048, dtype=torch.bool).triu(1) if sparse_mode == 3 else None
    out, _ = torch.ops.npu.npu_fused_infer_attention_score(
        q, k, v, atten_mask=mask, actual_seq_lengths=ends, actual_seq_lengths_kv=ends, num_heads=heads,
        scale=0.5, input_layout="TND", num_key_value_heads=kv_heads, sparse_mode=sparse_mode)
    v2, _ = torch.ops.npu.npu_fused_infer_attention_score_v2(
        q, k, v, query_rope=q_rope, key_rope=k_rope, atten_mask=mask, actual_seq_qlen=ends, actual_seq_kvlen=ends,
        num_query_heads=heads, num_key_value_heads=kv_heads, softmax_scale=0.5, input_layout="TND",
        sparse_mode=sparse_mode)
    v1_rope, _ = torch.ops.npu.npu_fused_infer_attention_score(  # MLA prefill: v1 with the rope parts apart
        q, k, v, query_rope=q_rope, key_rope=k_rope, atten_mask=mask, actual_seq_lengths=ends,
        actual_seq_lengths_kv=ends, num_heads=heads, scale=0.5, input_layout="TND", num_key_value_heads=kv_heads,
        sparse_mode=sparse_mode)
    with_rope = (torch.cat((q, q_rope), -1), torch.cat((k, k_rope), -1))
    for result, qq, kk in ((out, q, k), (v2, *with_rope), (v1_rope, *with_rope)):
        start = 0
        for n in lens:
            rows = slice(start, start + n)
            keys = kk[rows].double().repeat_interleave(heads // kv_heads, dim=1)
            values = v[rows].double().repeat_interleave(heads // kv_heads, dim=1)
            scores = torch.einsum("qhd,khd->hqk", qq[rows].double(), keys) * 0.5
            if sparse_mode == 3:
                scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
            expected = torch.einsum("hqk,khd->qhd", scores.softmax(-1), values)
            torch.testing.assert_close(result[rows].double(), expected, rtol=1e-5, atol=1e-5)
            start += n


def test_engine_dlinfers_pr350_mla_decodes_in_graph_mode_identically_to_eager(post_350, tmp_path):
    """lmdeploy's DeepSeek-V2 (MLA) step by step (vendor_graph_sim.realstack), post-#350 dlinfer: its MLA decode is
    FIA v2 with ``actual_seq_kvlen``; graph mode equals eager (hidden states, tokens, KV cache) and every graph
    refreshes its lengths on FIA v2's path of vendor_graph's table for G5."""
    out = tmp_path / "mla.json"
    env = {k: v for k, v in child_env(post_350, RELEASE).items() if k != "VENDOR_GRAPH_SIM"}
    proc = subprocess.run([sys.executable, "-m", "vendor_graph_sim.realstack", RELEASE, str(out), "lmdeploy-mla",
                           "--steps", "8"], capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result.get("dlinfer_import_error") is None, result["dlinfer_import_error"]
    (r,) = result["records"]
    assert r["parity"], r["mismatches"][:5]
    assert r["steps"] == 8 and r["tokens"] > 8 and r["graph_replays"] > 0, r
    assert set(r["eager_reasons"]) <= {"not a decode step"} and r["prefill"] == "prefill", r
    assert r["seqlen_paths"] == [path_for(releases.GENERATION_FACTS[releases.release_of(RELEASE).generation], FIA_V2)]


def test_engine_dlinfers_pr350_mla_decode_layout_of_the_emulated_fia_v2():
    """post-#350 dlinfer's MLA decode: FIA v2 in BNSD_NBSD over the paged cache seen as (blocks, KVH, block_size,
    D), rope parts apart; the emulated kernel gives what it gives the same call in BSND over (blocks, block_size,
    KVH, D)."""
    import torch
    from vendor_graph_sim import kernels  # noqa: F401  (registers the emulated operators)

    g = torch.Generator().manual_seed(1)
    batch, heads, nope, rope, bs, blocks = 3, 4, 16, 8, 4, 9
    q_nope, q_rope = torch.randn(batch, heads, 1, nope, generator=g), torch.randn(batch, heads, 1, rope, generator=g)
    cache = torch.randn(blocks, bs, 1, nope + rope, generator=g)
    table = torch.tensor([[1, 2, 3], [4, 5, 0], [6, 7, 8]], dtype=torch.int32)
    kv = [9, 2, 12]
    common = dict(num_query_heads=heads, num_key_value_heads=1, softmax_scale=0.25, block_table=table, block_size=bs,
                  actual_seq_kvlen=kv)
    permuted = cache.permute(0, 2, 1, 3)
    got, _ = torch.ops.npu.npu_fused_infer_attention_score_v2(
        q_nope, permuted[..., :nope], permuted[..., :nope], query_rope=q_rope, key_rope=permuted[..., nope:],
        input_layout="BNSD_NBSD", **common)
    want, _ = torch.ops.npu.npu_fused_infer_attention_score_v2(
        q_nope.transpose(1, 2), cache[..., :nope], cache[..., :nope], query_rope=q_rope.transpose(1, 2),
        key_rope=cache[..., nope:], input_layout="BSND", **common)
    assert got.shape == (heads, batch, 1, nope)
    torch.testing.assert_close(got, want.permute(2, 0, 1, 3))
    assert not torch.equal(got[:, 0], got[:, 1])
