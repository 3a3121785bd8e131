"""Property-based conformance (hypothesis): random schedules of batches and sequence lengths through
the Ascend graph runner on the simulator, checked at every step:

* graph output equals eager (hidden states bitwise, greedy tokens; :class:`~.harness.SideBySide`);
* every KV byte equals the eager session's, and the graph session's step changed no KV byte outside
  the slots of the live sequences' new tokens (padding rows, retired sequences, free blocks untouched);
* no buffer row past the live batch holds anything but padding.

A schedule draws the torch_npu generation, the attention op, the prompts (1 to 100 tokens: sequences
start anywhere within their KV blocks), the live set of every step, and sequences that finish and
hand their blocks to a new prompt. ``tests/conformance/test_operator_properties.py`` runs
:data:`CI_EXAMPLES` derandomized examples; ``tools/soak.py --property N`` runs any number.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from . import tiny_model as tm
from .harness import SideBySide, lmdeploy_configs, step_manager

CI_EXAMPLES = 30
GENERATIONS = ("G1", "G2a", "G2b", "G2c", "G3a", "G3b", "G4", "G5")
ATTENTIONS = ("fia", "fia_v2", "paged_attention")


@dataclass(frozen=True)
class Schedule:
    generation: str
    attention: str
    prompts: tuple[tuple[int, ...], ...]
    steps: tuple[tuple[int, ...], ...]  # live sequence indices, per step
    retire: tuple[tuple[int, int, tuple[int, ...]], ...]  # (after step, slot, new prompt)


@st.composite
def schedules(draw) -> Schedule:
    num_seqs = draw(st.integers(1, 10))
    token = st.integers(1, 255)
    prompts = tuple(tuple(draw(st.lists(token, min_size=1, max_size=100))) for _ in range(num_seqs))
    live = st.lists(st.integers(0, num_seqs - 1), min_size=1, max_size=num_seqs, unique=True).map(
        lambda xs: tuple(sorted(xs)))
    steps = tuple(draw(st.lists(live, min_size=1, max_size=10)))
    retire = tuple(draw(st.lists(st.tuples(st.integers(0, len(steps) - 1), st.integers(0, num_seqs - 1),
                                           st.lists(token, min_size=1, max_size=60).map(tuple)),
                                 max_size=3, unique_by=lambda r: r[0])))
    return Schedule(generation=draw(st.sampled_from(GENERATIONS)), attention=draw(st.sampled_from(ATTENTIONS)),
                    prompts=prompts, steps=steps, retire=retire)


@contextlib.contextmanager
def _pair(s: Schedule):
    import vendor_graph

    from . import device as sim

    vendor_graph.uninstall()
    importlib.import_module("vendor_graph.ascend").activate()
    with sim.use_torch_npu(s.generation), torch.inference_mode(), torch.npu.stream(torch.npu.Stream()):
        model = tm.TinyDecoder("ascend", ascend_attention=s.attention, device="npu")
        configs = lmdeploy_configs("ascend", model, len(s.prompts))
        with step_manager("ascend", configs.model_config) as mgr:
            from .harness import _build_runner

            eager = tm.DecodeSession(model, [list(p) for p in s.prompts], device="npu")
            yield SideBySide(model=model, runner=_build_runner("ascend", model, configs, mgr),
                             eager=eager, graph=eager.twin())


def _slots_written(session: tm.DecodeSession, live, lengths: dict[int, int]) -> set[tuple[int, int]]:
    """(block, offset) of each live sequence's new token (position ``lengths[seq] - 1``, the length
    before the step): the only KV a step may write. Read after the step, whose blocks then exist."""
    bs = session.model.config.block_size
    return {(session.block_tables[seq][(lengths[seq] - 1) // bs], (lengths[seq] - 1) % bs) for seq in live}


def _changed_slots(before, after) -> set[tuple[int, int]]:
    changed = set()
    for pair_b, pair_a in zip(before, after, strict=True):
        for b, a in zip(pair_b, pair_a, strict=True):
            diff = (b != a.cpu()).reshape(b.shape[0], b.shape[1], -1).any(-1)  # bshd: (block, offset)
            changed.update((int(i), int(j)) for i, j in diff.nonzero().tolist())
    return changed


def check(s: Schedule) -> list[str]:
    """Run one schedule; the problems found (empty: it conforms)."""
    problems: list[str] = []
    retire = {step: (slot, list(prompt)) for step, slot, prompt in s.retire}
    with _pair(s) as pair:
        assert tm.kv_cache_layout("ascend") == "bshd"
        for step, live in enumerate(s.steps):
            before = [tuple(t.cpu().clone() for t in layer) for layer in pair.graph.kv_caches]
            lengths = {seq: len(pair.graph.tokens[seq]) for seq in live}
            pair.step(list(live))
            stray = _changed_slots(before, pair.graph.kv_caches) - _slots_written(pair.graph, live, lengths)
            if stray:
                problems.append(f"step {step} live {list(live)}: KV written outside the live slots at "
                                f"(block, offset) {sorted(stray)[:5]}")
            if step in retire:
                pair.replace(*retire[step])
        problems.extend(pair.mismatches)
    return problems


def property_test(examples: int = CI_EXAMPLES, *, derandomize: bool = True, seed: int | None = None):
    """A hypothesis test over :func:`schedules` (call it to run; raises on the first failing example,
    shrunk, with the schedule in the message)."""

    @settings(max_examples=examples, derandomize=derandomize, deadline=None, database=None,
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(schedules())
    def graph_equals_eager_and_kv_stays_in_its_slots(s: Schedule) -> None:
        problems = check(s)
        assert not problems, f"{s}: {problems[:3]}"

    if seed is not None:
        from hypothesis import seed as fixed_seed

        graph_equals_eager_and_kv_stays_in_its_slots = fixed_seed(seed)(graph_equals_eager_and_kv_stays_in_its_slots)
    return graph_equals_eager_and_kv_stays_in_its_slots


__all__ = ["CI_EXAMPLES", "Schedule", "check", "property_test", "schedules"]
