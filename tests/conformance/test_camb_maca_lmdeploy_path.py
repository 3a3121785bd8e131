"""Camb and MACA decode through lmdeploy's own path: its ``update_step_context`` (on 0.18 with vendor_graph's fix),
its ``DlinferAttentionImpl`` and ``paged_attention_fwd``, down to ``dlinfer.ops`` and the vendor kernel, eager and
on lmdeploy's CUDA graph runner. The kernels read their lengths from device memory: a host tensor reaching one
is an error on the simulator, and a length the graph does not read from its buffer is a parity failure."""

from __future__ import annotations

import dataclasses
import importlib

import dlinfer.ops
import pytest
from vendor_graph_sim import harness

from vendor_graph import vendors
from vendor_graph.install import metadata_fix
from vendor_graph.upstream import compat

RELEASE = compat.series(compat.installed_lmdeploy_version())
RELEASE_018 = compat.lmdeploy_api().separate_host_seqlens
VENDORS = [v for v in ("camb", "maca") if RELEASE in compat.SUPPORTED_SERIES[v]]
pytestmark = pytest.mark.skipif(not VENDORS, reason=f"Camb/MACA unsupported on lmdeploy {RELEASE}")


@pytest.mark.parametrize("vendor", VENDORS)
def test_decode_goes_through_lmdeploys_attention_to_the_vendor_kernel_with_device_lengths(vendor, cuda_style_backend,
                                                                                          monkeypatch):
    device = "npu" if cuda_style_backend == "sim" else harness.REAL_BACKENDS[cuda_style_backend]
    calls = []
    decode = dlinfer.ops.paged_decode_attention

    def spy(query, key_cache, value_cache, block_table, block_size, q_seq_len, kv_seq_len, *args, **kwargs):
        calls.append((query.device.type, kv_seq_len.device.type, tuple(kv_seq_len.shape)))
        return decode(query, key_cache, value_cache, block_table, block_size, q_seq_len, kv_seq_len, *args, **kwargs)

    monkeypatch.setattr(dlinfer.ops, "paged_decode_attention", spy)  # lmdeploy's kernel looks it up per call
    pair = harness.run(vendor, 3, steps=18, num_seqs=9, backend=cuda_style_backend)
    assert not pair.mismatches, pair.mismatches[:3]
    assert pair.runner.stats.replays > 0 and pair.runner.stats.captures >= 2
    # two layers, each called it in every eager step and twice per capture (lmdeploy's runner warms up
    # first); replays run the captured kernels
    assert len(calls) == 2 * (18 + 2 * pair.runner.stats.captures)
    assert {(q, kv) for q, kv, _ in calls} == {(device, device)}
    if RELEASE_018:
        assert metadata_fix.metadata_fix_installed(importlib.import_module(
            f"lmdeploy.pytorch.backends.dlinfer.{vendor}.op_backend").__dict__[f"{vendor.capitalize()}OpsBackend"])


@pytest.mark.skipif(not RELEASE_018, reason="lmdeploy 0.18's decode kernel reads kv_seqlens_cpu")
@pytest.mark.parametrize("vendor", VENDORS)
def test_a_host_length_tensor_reaching_the_decode_kernel_is_refused(vendor, monkeypatch):
    """The failure put back: decode metadata carrying host copies under the _cpu names (as Ascend's has)."""
    fix = metadata_fix.metadata_for_018

    def host_lengths(metadata_cls):
        build = fix(metadata_cls)

        def with_host_copies(is_decoding, block_offsets, **kwargs):
            meta = build(is_decoding, block_offsets, **kwargs)
            meta.kv_seqlens_cpu = meta.kv_seqlens.cpu()
            return meta

        with_host_copies.__qualname__ = "metadata_for_018"
        return with_host_copies

    monkeypatch.setattr(metadata_fix, "metadata_for_018", host_lengths)
    with pytest.raises(RuntimeError, match="kv_seqlens is a cpu tensor .* host tensor reaching this device kernel"):
        harness.run(vendor, 3, steps=6, num_seqs=4)


@pytest.mark.skipif(not RELEASE_018, reason="lmdeploy 0.18's decode kernel reads kv_seqlens_cpu")
@pytest.mark.parametrize("vendor", VENDORS)
def test_a_graph_not_reading_the_lengths_from_its_buffer_gives_wrong_answers(vendor, monkeypatch):
    """The failure put back: the buffer spec without 0.18's bindings of kv_seqlens_cpu / cu_seqlens_q(_cpu), so
    the captured kernel keeps reading the capture step's lengths."""
    profile = vendors.profile(vendor)
    api = dataclasses.replace(compat.lmdeploy_api(), separate_host_seqlens=False)
    monkeypatch.setitem(vars(profile), "spec", profile.build_spec(api))
    pair = harness.run(vendor, 3, steps=18, num_seqs=9)
    assert any("hidden states differ" in m for m in pair.mismatches), pair.mismatches[:3]
