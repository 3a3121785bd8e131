"""Property: over random schedules of batches and sequence lengths (hypothesis, derandomized), the
Ascend graph runner's output equals eager at every step and no KV byte outside the live slots
changes. CI runs VENDOR_GRAPH_PROPERTY_EXAMPLES examples (default 30); tools/soak.py --property N
runs any number."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("hypothesis")

from vendor_graph_sim import properties  # noqa: E402

EXAMPLES = int(os.environ.get("VENDOR_GRAPH_PROPERTY_EXAMPLES", str(properties.CI_EXAMPLES)))


def test_random_schedules_graph_equals_eager_and_kv_stays_in_its_slots(sim_backend):
    properties.property_test(EXAMPLES, derandomize=True)()


def test_the_property_catches_a_padding_row_that_writes_kv(sim_backend, monkeypatch):
    """The check is not vacuous: padding kv_start_indices of 0 (lmdeploy's reserved block 0, slot 0)
    instead of -1 makes padding rows write KV, which the stray-slot check reports."""
    from vendor_graph.buffers import BufferSpec

    fill = BufferSpec.fill

    def fill_padding_with_slot_zero(self, graph_meta, inputs, attn_metadata, context=None):
        out = fill(self, graph_meta, inputs, attn_metadata, context)
        kv_start = graph_meta.input_buffers.get("kv_start_indices")
        if kv_start is not None:
            kv_start.masked_fill_(kv_start < 0, 0)
        return out

    monkeypatch.setattr(BufferSpec, "fill", fill_padding_with_slot_zero)
    s = properties.Schedule(generation="G5", attention="fia", prompts=((5, 6, 7), (8, 9), (10,), (11,)),
                            steps=((0, 1, 2), (0, 1, 2), (0, 1, 2)), retire=())  # batch 3 pads to 4
    problems = properties.check(s)
    assert any("KV written outside the live slots at (block, offset) [(0, 0)]" in p for p in problems), problems
