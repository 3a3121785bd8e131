"""Mutation checks: each classic graph-mode failure put back into the shipped code,
and the suite must catch it.

Each case copies ``vendor_graph/`` to a temporary directory, applies one textual change to the shipped module
(the exact text must occur once, so a refactor that moves it fails here loudly instead of silently
testing nothing), and runs the tests that guard against it with the mutated copy first on the path.
The case passes when those tests fail, and records which test caught it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from vendor_graph.upstream import compat

ROOT = Path(__file__).resolve().parents[2]
RELEASE = compat.series(compat.installed_lmdeploy_version())
PARITY = "tests/conformance/test_decode_parity.py"
ENGINE = "tests/realstack/test_engine.py::test_engine_serves_camb_and_maca_the_same_tokens_in_graph_mode_as_eager"
SCHEDULE = "tests/conformance/test_random_schedules.py::test_random_schedule"
ASCEND_PARITY = f"{PARITY}::test_ascend_graph_matches_eager_and_refreshes_seqlens"
ASCEND_SHRINKING = f"{PARITY}::test_ascend_batches_shrinking_within_their_bucket_match_eager"


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # under vendor_graph
    old: str
    new: str
    tests: tuple[str, ...]
    needs: str = "ascend"  # the vendor whose conformance catches it on this lmdeploy release
    releases: tuple[str, ...] | None = None  # the lmdeploy series whose code path it changes (None: every one)

    def applies(self, release: str) -> bool:
        return release in compat.SUPPORTED_SERIES[self.needs] and (self.releases is None or release in self.releases)


MUTATIONS = (
    Mutation(
        "padding kv_start_indices -1 changed to 0", "vendors/ascend/spec.py",
        "        return [-1] * dims.tokens",
        "        return [0] * dims.tokens",
        (f"{ASCEND_PARITY}[fia-G5]",)),
    # Item 6 of issue 29: the KV write's documented slot rules (docs/ascend_kernel_facts.md). With -1 changed to 0
    # above, every padding row writes slot 0: ATB ReshapeAndCache refuses the repeated slot at the first replay.
    Mutation(
        "MLA KV padding -1 (npu_scatter_nd_update_ documents an index out of range as unsupported)",
        "vendors/ascend/spec.py",
        "    return [i % block_size for i in range(dims.tokens)]",
        "    return [-1] * dims.tokens",
        (f"{ASCEND_SHRINKING}[G5-mla]",)),
    Mutation(
        "Camb max_kv_seq_len left at the value frozen at capture", "vendors/cuda_style.py",
        'constants={"max_kv_seq_len": _derive_from_tensor, api.max_q_attr: _derive_from_tensor},',
        'constants={api.max_q_attr: _derive_from_tensor},',
        ("tests/conformance/test_decode_parity.py::test_camb_maca_on_lmdeploys_cuda_runner_match_eager[camb]",),
        needs="camb"),
    Mutation(
        "Ascend seq-len update skipped", "vendors/ascend/runner.py",
        "        self._refresh_seqlens(graph, lens)\n",
        "",
        (f"{ASCEND_PARITY}[fia-G5]", f"{ASCEND_PARITY}[fia-G1]")),
    Mutation(
        "block table left out of the attention bind step", "buffers/fields.py",
        'bind=(Ref.attn("block_offsets"), Ref.context("block_offsets")))',
        'bind=(Ref.context("block_offsets"),))',
        (f"{ASCEND_PARITY}[fia-G5]",)),
    Mutation(
        "padding tail of an earlier larger batch not reset", "buffers/fill.py",
        "                boxes.append((view, pad if pad is not None else pad_one.expand(view.shape)))\n",
        "                pass\n",
        (f"{ASCEND_PARITY}[fia-G5]",)),
    Mutation(
        "Ascend buckets above 16 rounded to multiples of 32, not 16", "sizing/buckets.py",
        "        return -(-batch // 16) * 16",
        "        return -(-batch // 32) * 32",
        (f"{ASCEND_SHRINKING}[G5-fia]",)),
    Mutation(
        "stale-graph check skipped before a replay", "runtime/step.py",
        "        stale = self.guard.check(key, kwargs)",
        "        stale = None",
        (f"{ASCEND_SHRINKING}[G5-fia]",)),
    Mutation(
        "host wait before NPUGraph.update put back", "vendors/ascend/runner.py",
        "                    graph.update_stream.wait_event(fence)  # torch_npu updates on this stream: device order",
        "                    fence.synchronize()",
        ("tests/sim/test_fill_ops.py::test_a_replay_step_copies_its_inputs_once_and_never_waits_on_the_host"
         "[ascend-graph-update]",)),
    Mutation(
        "graph update not ordered after the previous replay", "vendors/ascend/runner.py",
        "                    graph.update_stream.wait_event(fence)  # torch_npu updates on this stream: device order",
        "                    pass",
        ("tests/conformance/test_ascend_runner.py::test_the_next_refresh_waits_for_the_previous_replay[G5]",)),
    Mutation(
        "context inputs copied by a second device operation", "install/profile.py",
        "        new_inputs = profile.spec.fill(graph_meta, inputs, attn_metadata, context)",
        "        new_inputs = profile.spec.fill(graph_meta, inputs, attn_metadata)",
        ("tests/unit/test_mixin_fill_context.py",)),
    Mutation(
        "graph looked up by the live batch instead of its bucket", "vendors/ascend/runner.py",
        "padded_batch=buckets.pad_to_bucket(self._sizes, batch),",
        "padded_batch=batch,",
        (f"{ASCEND_PARITY}[fia-G5]",)),
    Mutation(
        "Ascend graph output returned padded, not sliced to the step's tokens", "vendors/ascend/runner.py",
        "        return self.model.get_outputs_cudagraph(graph.output_buffers, **kwargs)",
        "        return graph.output_buffers",
        (f"{ASCEND_PARITY}[fia-G5]",)),
    # Issue 29, item 7: the classes that only area tests caught, now caught by the ordinary parity and schedules.
    # Padding contents (the harness checks padding rows against the documented inert values, not the spec's own).
    Mutation(
        "padding: host KV lengths of padding rows 1, not 0 (0.16/0.17)", "vendors/ascend/spec.py",
        "            BufferField(HOST_KV_SEQLENS, (BATCH,), torch.int32, pad=0, placement=HOST,\n"
        "                        source=Ref.attn(\"kv_seqlens\"), bind=(Ref.attn(\"kv_seqlens\"),)),",
        "            BufferField(HOST_KV_SEQLENS, (BATCH,), torch.int32, pad=1, placement=HOST,\n"
        "                        source=Ref.attn(\"kv_seqlens\"), bind=(Ref.attn(\"kv_seqlens\"),)),",
        (f"{ASCEND_PARITY}[fia-G5]",), releases=("0.16", "0.17")),
    Mutation(
        "padding: host KV lengths of padding rows 1, not 0 (0.18)", "vendors/ascend/spec.py",
        "            BufferField(HOST_KV_SEQLENS, (BATCH,), torch.int32, pad=0, placement=HOST,\n"
        "                        source=Ref.attn(\"kv_seqlens_cpu\")",
        "            BufferField(HOST_KV_SEQLENS, (BATCH,), torch.int32, pad=1, placement=HOST,\n"
        "                        source=Ref.attn(\"kv_seqlens_cpu\")",
        (f"{ASCEND_PARITY}[fia-G5]",), releases=("0.18",)),
    Mutation(
        "padding: Camb/MACA device KV lengths of padding rows 1, not 0", "vendors/cuda_style.py",
        'BufferField("kv_seqlens", (BATCH,), torch.int32, pad=0, source=Ref.attn("kv_seqlens"),',
        'BufferField("kv_seqlens", (BATCH,), torch.int32, pad=1, source=Ref.attn("kv_seqlens"),',
        (f"{PARITY}::test_camb_maca_on_lmdeploys_cuda_runner_match_eager[camb]",), needs="camb"),
    Mutation(
        "padding: block-table rows of padding point at block 1, not reserved block 0", "buffers/fields.py",
        'return BufferField("block_offsets", (BATCH, BLOCKS), torch.int32, pad=0,',
        'return BufferField("block_offsets", (BATCH, BLOCKS), torch.int32, pad=1,',
        (f"{ASCEND_PARITY}[fia-G5]",)),
    Mutation(
        "an 'inputs changed' refusal swallowed: a graph replays ignoring inputs_embeds it was captured without",
        "buffers/fill.py",
        "            if src is not None:\n                raise GraphInputsChanged(\n"
        "                    f\"{self.vendor} graph for batch {state.dims.batch} was captured without {f.source}, \"",
        "            if src is not None and False:\n                raise GraphInputsChanged(\n"
        "                    f\"{self.vendor} graph for batch {state.dims.batch} was captured without {f.source}, \"",
        (f"{SCHEDULE}[2]",)),
    Mutation(
        "Ascend graph key ignores the query length", "vendors/ascend/runner.py",
        "            query_len=max(1, input_ids.size(-1) // rows),",
        "            query_len=1,",
        (f"{SCHEDULE}[0]",)),
    Mutation(
        "lmdeploy's CUDA runner (adopted) output returned padded, not sliced", "runtime/adopted.py",
        "        return model.get_outputs_cudagraph(meta.output_buffers, **kwargs)",
        "        return meta.output_buffers",
        ("tests/conformance/test_decode_parity.py::test_camb_maca_on_lmdeploys_cuda_runner_match_eager[camb]",),
        needs="camb"),
    # Issue 36: the Camb/MACA failures put back, each caught inside lmdeploy's engine (pipeline, graph vs eager).
    Mutation(
        "engine: Camb max_kv_seq_len left at the value frozen at capture", "vendors/cuda_style.py",
        'constants={"max_kv_seq_len": _derive_from_tensor, api.max_q_attr: _derive_from_tensor},',
        'constants={api.max_q_attr: _derive_from_tensor},',
        (f"{ENGINE}[camb-basic]",), needs="camb"),
    # The whole tail left stale is benign inside the engine (a stale row recomputes the K/V its slot already holds:
    # same token, same position); kv_start_indices' alone is not: the padding row writes the pad token's K/V there.
    Mutation(
        "engine: MACA kv_start_indices padding tail of an earlier larger batch not reset (the only -1 padding)",
        "buffers/fill.py",
        "        plan = (live if live.numel() else None, _box_views(dst, tuple(extent), st.high_water, st.pad_one, "
        "st.pad_full))\n",
        "        plan = (live if live.numel() else None, [] if st.pad == -1 else _box_views(dst, tuple(extent), "
        "st.high_water, st.pad_one, st.pad_full))\n",
        (f"{ENGINE}[maca-basic]",), needs="maca"),
    Mutation(
        "engine: dlinfer's cudagraph patch left in force over vendor_graph's buffer methods", "install/patching.py",
        "            setattr(patch.owner, patch.name, patch.ours)",
        "            pass",
        (f"{ENGINE}[camb-basic]",), needs="camb"),
)


def _copy(tmp_path: Path) -> Path:
    """A copy of the runtime package in ``tmp_path``; pytest run from there imports it first."""
    shutil.copytree(ROOT / "vendor_graph", tmp_path / "vendor_graph", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _pytest(where: Path, tests: list[str], *options: str) -> subprocess.CompletedProcess:
    """The repository's ``tests`` run with the working directory (first on ``sys.path``) at ``where``."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT),
               "-c", str(ROOT / "pyproject.toml"), *options, *(str(ROOT / t) for t in tests)]
    return subprocess.run(command, cwd=where, capture_output=True, text=True, timeout=600)


def _mutated_tree(tmp_path: Path, mutation: Mutation) -> Path:
    where = _copy(tmp_path)
    target = where / "vendor_graph" / mutation.path
    text = target.read_text()
    assert text.count(mutation.old) == 1, f"{mutation.path}: the guarded code moved; update this mutation"
    target.write_text(text.replace(mutation.old, mutation.new))
    return where


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.name for m in MUTATIONS])
def test_classic_failure_is_caught(mutation, tmp_path):
    if not mutation.applies(RELEASE):
        pytest.skip(f"it changes code lmdeploy {RELEASE} does not run, or its guard runs on {mutation.needs}, "
                    f"unsupported on {RELEASE}")
    proc = _pytest(_mutated_tree(tmp_path, mutation), list(mutation.tests), "-x")
    caught = re.findall(r"^FAILED (\S+)", proc.stdout, flags=re.M)
    assert proc.returncode == 1 and caught, (
        f"mutation '{mutation.name}' was not caught (pytest exit {proc.returncode}):\n{proc.stdout[-3000:]}")
    print(f"'{mutation.name}' caught by {caught[0]}")


def test_the_unmutated_copy_passes(tmp_path):
    """The harness itself: the same tests on an unchanged copy must pass, or every 'catch' above is noise."""
    tests = sorted({t for m in MUTATIONS if m.applies(RELEASE) for t in m.tests})
    proc = _pytest(_copy(tmp_path), tests)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "vendor_graph" in proc.stdout or "passed" in proc.stdout
