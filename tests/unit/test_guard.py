"""vendor_graph.runtime.guard on plain CPU tensors: what counts as stale, what does not, what it costs."""

from __future__ import annotations

import gc

import torch

from vendor_graph.runtime.guard import FULL_CHECK_EVERY, StaleGraphGuard


def _caches(n=3):
    return [(torch.zeros(8, 4), torch.zeros(8, 4)) for _ in range(n)]


def test_unchanged_caches_pass_and_a_new_cache_is_stale():
    kv = _caches()
    guard = StaleGraphGuard(None)
    guard.record("k", {"past_key_values": kv})
    for _ in range(FULL_CHECK_EVERY + 2):  # through the O(1) path and a full check
        assert guard.check("k", {"past_key_values": kv}) is None
    assert guard.check("k", {"past_key_values": [list(p) for p in kv]}) is None  # new lists, same tensors
    moved = [kv[0], (kv[1][0], kv[1][1].clone()), kv[2]]
    stale = guard.check("k", {"past_key_values": moved})
    assert stale is not None and not stale.all_graphs
    assert stale.reason.startswith("past_key_values[3] changed since capture (data_ptr 0x")


def test_same_memory_new_view_with_the_same_layout_is_adopted_a_different_layout_is_not():
    kv = _caches(1)
    guard = StaleGraphGuard(None)
    guard.record("k", {"past_key_values": kv})
    same = [(kv[0][0].view(8, 4), kv[0][1].view(8, 4))]  # new tensor objects, same address and layout
    assert guard.check("k", {"past_key_values": same}) is None
    reshaped = [(kv[0][0].view(4, 8), kv[0][1])]
    stale = guard.check("k", {"past_key_values": reshaped})
    assert stale is not None and "shape (8, 4) -> (4, 8)" in stale.reason and "stride" in stale.reason


def test_a_freed_cache_forces_a_full_check_even_in_the_same_list():
    kv = [torch.zeros(64, 64)]
    guard = StaleGraphGuard(None)
    guard.record("k", {"past_key_values": kv})
    assert guard.check("k", {"past_key_values": kv}) is None  # now on the O(1) path for this list
    kv[0] = torch.ones(128, 64)  # replaced in place inside the very same list; the old tensor dies
    gc.collect()
    stale = guard.check("k", {"past_key_values": kv})
    assert stale is not None and "shape (64, 64) -> (128, 64)" in stale.reason


def test_weights_moved_invalidate_every_graph():
    model = torch.nn.Linear(4, 4)
    guard = StaleGraphGuard(model, weights_every=2)
    kv = _caches(1)
    guard.record("a", {"past_key_values": kv})
    guard.record("b", {"past_key_values": kv})
    assert guard.check("a", {"past_key_values": kv}) is None
    model.weight = torch.nn.Parameter(model.weight.detach().clone())
    stale = guard.check("a", {"past_key_values": kv})  # the 2nd check looks at the weights
    assert stale.all_graphs and "model weights moved since capture (1 of 2" in stale.reason
    assert guard.check("b", {"past_key_values": kv}).reason == stale.reason


def test_invalidate_and_clear():
    kv = _caches(1)
    guard = StaleGraphGuard(None)
    guard.record("k", {"past_key_values": kv})
    guard.invalidate("woken up")
    assert guard.check("k", {"past_key_values": kv}).reason == "woken up"
    guard.forget("k")
    guard.record("k", {"past_key_values": kv})
    assert guard.check("k", {"past_key_values": kv}) is None
    guard.clear()
    assert guard.check("k", {"past_key_values": kv}) is None  # nothing recorded: nothing to say
