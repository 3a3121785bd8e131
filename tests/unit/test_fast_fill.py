"""The fast fill (vendor_graph/buffers/fast.py) against the checked fill it caches (buffers/fill.py): the same
steps through a graph of each, and after every step the same buffer bytes and the same bound attributes."""

import random

import pytest
import torch

from vendor_graph.buffers import BufferSpec, fast
from vendor_graph.buffers.fill import CheckedBufferSpec

from .test_buffers import SPECS, decode_step, graph_meta


def _schedule(seed: int) -> list[tuple[int, int]]:
    """(batch, blocks) per step, growing and shrinking: a random cycle repeated, so the fast fill serves the
    repeats (it repeats a step seen after the same previous one), then a random tail the checked fill takes."""
    rng = random.Random(seed)
    cycle = [(rng.choice([1, 3, 5, 8]), rng.choice([1, 2, 3])) for _ in range(5)]
    return cycle * 7 + [(rng.choice([1, 3, 5, 8]), rng.choice([1, 2, 3])) for _ in range(5)]


def _named(meta, value):
    """``value`` as the name of the graph's buffer it is, else itself."""
    if torch.is_tensor(value):
        return next((("buffer", k) for k, v in meta.input_buffers.items() if v is value), value)
    return value


def _same(a, b) -> bool:
    if torch.is_tensor(a) and torch.is_tensor(b):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _differences(fast_meta, checked_meta, fast_roots, checked_roots) -> list[str]:
    out = []
    if fast_meta.input_buffers.keys() != checked_meta.input_buffers.keys():
        return [f"buffers {sorted(fast_meta.input_buffers)} != {sorted(checked_meta.input_buffers)}"]
    for key, tensor in checked_meta.input_buffers.items():
        if not _same(fast_meta.input_buffers[key], tensor):
            out.append(f"buffer {key}")
    for where, mine, theirs in zip(("kwargs", "attn_metadata", "context"), fast_roots, checked_roots, strict=True):
        mine = mine if isinstance(mine, dict) else vars(mine)
        theirs = theirs if isinstance(theirs, dict) else vars(theirs)
        if mine.keys() != theirs.keys():
            out.append(f"{where} attributes {sorted(mine)} != {sorted(theirs)}")
            continue
        for key in theirs:
            if not _same(_named(fast_meta, mine[key]), _named(checked_meta, theirs[key])):
                out.append(f"{where}.{key}")
    return out


def run_both(name: str, with_context: bool, schedule: list[tuple[int, int]]) -> tuple[list, int]:
    """Every step of ``schedule`` through a graph of the vendor's spec and one of its checked fill only;
    returns the steps where they differ and how many steps the fast fill served."""
    spec = SPECS[name]
    checked = CheckedBufferSpec(spec.vendor, spec.fields, spec.constants, spec.held, spec.check_meta)
    graphs = [(spec, graph_meta(8)), (checked, graph_meta(8))]
    for which, meta in graphs:
        inputs, attn, ctx = decode_step(name, *schedule[0], seed=0)
        meta.input_buffers = which.make(meta, inputs, attn)
        which.fill(meta, inputs, attn)
        which.bind_context(meta, ctx)
    served = []
    original = fast.FastFill.fill

    def counted(self, *args):
        new_inputs = original(self, *args)
        served.append(new_inputs is not None)
        return new_inputs

    differences = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fast.FastFill, "fill", counted)
        for i, (batch, blocks) in enumerate(schedule[1:], start=1):
            roots = []
            for which, meta in graphs:
                inputs, attn, ctx = decode_step(name, batch, blocks, seed=i)
                new_inputs = which.fill(meta, inputs, attn, ctx if with_context else None)
                which.bind_context(meta, ctx)
                roots.append((new_inputs, attn, ctx))
            found = _differences(graphs[0][1], graphs[1][1], *roots)
            if found:
                differences.append((i, schedule[:i + 1][-3:], found))
    return differences, sum(served)


@pytest.mark.parametrize("with_context", [False, True], ids=["fill-then-bind", "fill-with-context"])
@pytest.mark.parametrize("name", SPECS)
def test_the_fast_fill_writes_and_binds_exactly_what_the_checked_fill_does(name, with_context):
    schedule = _schedule(seed=len(name) + with_context)
    differences, served = run_both(name, with_context, schedule)
    assert differences == []
    assert served >= len(schedule) // 2, served  # the comparison is of the fast fill, not the checked one


def test_a_fast_fill_that_diverges_is_caught(monkeypatch):
    """The comparison above fails when the fast fill repeats a step without its padding resets."""
    original = fast.FastFill.learn

    def without_resets(self, writes, before):
        original(self, [(st, src, extent, (live, [])) for st, src, extent, (live, _boxes) in writes], before)

    monkeypatch.setattr(fast.FastFill, "learn", without_resets)
    schedule = [(5, 3), (3, 2), (5, 3), (3, 2), (5, 3), (3, 2), (5, 3), (3, 2)]
    differences, served = run_both("camb-0.17", False, schedule)
    assert served and differences
    assert any("buffer kv_start_indices" in found for _i, _steps, found in differences), differences


def test_the_vendors_spec_is_the_checked_fill_with_the_cache():
    assert issubclass(BufferSpec, CheckedBufferSpec) and BufferSpec.fast_fill
