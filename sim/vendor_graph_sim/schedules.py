"""Seeded random decode schedules over every vendor configuration (the CI suite and tools/soak.py).

A seed draws the whole configuration and workload: the vendor (those the installed lmdeploy supports), the
torch_npu generation (G0 included: it runs eager) and Ascend attention op (MLA variants included), one or
several query tokens per sequence (every third seed: 2 or 3, on Ascend FIA / FIA v2), ``max_batches``
(1, 3, 17, 257 or anything up to 64), explicit capture sizes or the vendor's rule, and the live set of every
step: batch sizes that jump across buckets or shrink within one, sequences joining and leaving the batch,
finishing and handing their KV blocks to a new prompt, and, mid-run, the KV caches moved to fresh memory,
weight updates (new tensors with the runner reset, or new values in the same tensors), a step that feeds
inputs_embeds (a graph captured without them must refuse it: that step runs eager) and two steps issued back
to back before anything syncs (single-token schedules).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from vendor_graph.sizing import buckets
from vendor_graph.sizing.buckets import ascend_capture_sizes
from vendor_graph.upstream import compat
from vendor_graph.vendors.ascend.releases import GENERATION_FACTS

from . import tiny_model as tm
from .harness import SideBySide, run

MAX_BATCHES = (1, 3, 17, 257)  # besides a random one up to 64
# embeds_next: the next step feeds inputs_embeds (a multimodal step): a graph captured without them must refuse
# it ("inputs changed", that step eager), so a runner that swallows the refusal fails the schedule.
# overlap_next (single-token schedules): the next two steps are issued back to back before anything syncs, as an
# engine keeping the next input on the device does, so a refresh not ordered after the replay is seen.
EVENTS = ("realloc_kv", "weights_moved", "weights_in_place", "embeds_next", "overlap_next")
EVENT_CHANCE = {"embeds_next": 0.5, "overlap_next": 0.5}  # per schedule; 0.25 for the others
FULL_BATCH_STEPS = 3  # a schedule with every one of 257 sequences live runs only this many steps (cost)
# Every third seed (0, 3, 6, ...) is a multi-token decode schedule (speculative decoding: 2 or 3 query tokens per
# sequence, Ascend FIA/FIA v2, the only multi-token decode path modelled), so any run of CI's 20/60/100 seeds has
# at least a quarter of them: a graph key or buffer that ignores the query length fails in many seeds, not in one
# of hundreds (issue 29: 9 of 300 seeds drew it when it was a 1-in-4 draw among Ascend FIA seeds).
MULTI_TOKEN_EVERY = 3


@dataclass(frozen=True)
class Case:
    seed: int
    vendor: str
    generation: str | None
    attention: str | None
    query_len: int
    max_batches: int
    capture_sizes: tuple[int, ...] | None
    num_seqs: int
    plan: tuple[tuple[int, ...], ...]
    replacements: tuple[tuple[int, int, tuple[int, ...]], ...]  # (after step, slot, new prompt)
    events: tuple[tuple[int, str], ...]  # (after step, event)

    @property
    def config(self) -> str:
        """The vendor configuration: vendor, generation and attention op (Ascend)."""
        return f"{self.vendor}/{self.generation}/{self.attention}" if self.vendor == "ascend" else self.vendor

    def shrinks_within_a_bucket(self) -> bool:
        """A step whose batch is smaller than the step before's and takes the same graph."""
        sizes = _sizes(self.vendor, self.max_batches, self.capture_sizes)
        batches = [len(a) for a in self.plan]
        return any(b < a and buckets.pad_to_bucket(sizes, a) == buckets.pad_to_bucket(sizes, b)
                   for a, b in itertools.pairwise(batches))

    def dimensions(self) -> dict[str, str]:
        """What this schedule exercises, beyond its configuration (the soak counts schedules by each)."""
        return {"max_batches": str(self.max_batches) if self.max_batches in MAX_BATCHES else "other (2-64)",
                "capture_sizes": "explicit" if self.capture_sizes else "default",
                "query_len": str(self.query_len),
                "sequences finish and join": "yes" if self.replacements else "no",
                "shrinks within a bucket": "yes" if self.shrinks_within_a_bucket() else "no",
                **{f"event {e}": "yes" if any(x == e for _, x in self.events) else "no" for e in EVENTS}}

    def __str__(self) -> str:
        sizes = f"sizes {list(self.capture_sizes)}" if self.capture_sizes else "default sizes"
        events = ", ".join(f"{e} after {s}" for s, e in self.events) or "no events"
        return (f"seed {self.seed}: {self.config}, query_len {self.query_len}, max_batches {self.max_batches} "
                f"({sizes}), {self.num_seqs} seqs, {len(self.plan)} steps, batches "
                f"{[len(a) for a in self.plan]}, {len(self.replacements)} replaced, {events}")


def _sizes(vendor: str, max_batches: int, capture_sizes: tuple[int, ...] | None) -> list[int]:
    """The batch sizes the vendor's runner captures (lmdeploy's CUDA rule for Camb and MACA)."""
    rule = ascend_capture_sizes if vendor == "ascend" else buckets.cuda_capture_sizes
    return buckets.capture_sizes(rule, max_batches, capture_sizes)


def _batch_sizes(rng: random.Random, sizes: list[int], num_seqs: int, steps: int) -> list[int]:
    """A batch size per step: runs of a size, then a jump anywhere or a shrink within the current bucket
    (a smaller batch in the same graph: the rows the larger one left must read as padding)."""
    out, size = [], rng.randint(1, num_seqs)
    while len(out) < steps:
        out.extend([size] * rng.randint(1, 3))
        bucket = buckets.pad_to_bucket(sizes, size)
        below = max((s for s in sizes if s < bucket), default=0)
        if size - 1 > below and rng.random() < 0.5:
            size = rng.randint(below + 1, size - 1)
        else:
            size = rng.randint(1, num_seqs)
    return out[:steps]


def case(seed: int) -> Case:
    """The schedule ``seed`` runs: configuration and workload drawn from the seed alone."""
    rng = random.Random(seed)
    vendors = compat.vendors_supporting(compat.installed_lmdeploy_version())
    multi_token = "ascend" in vendors and seed % MULTI_TOKEN_EVERY == 0
    vendor = "ascend" if multi_token else rng.choice(vendors)
    generation = attention = None
    query_len = 1
    if vendor == "ascend":
        # A multi-token seed takes a generation with a graph API (G0 runs eager and would test no graph key).
        generation = rng.choice([g for g in GENERATION_FACTS if g != "G0" or not multi_token])
        attention = rng.choice(tm.MULTI_TOKEN_ATTENTION if multi_token else tm.ASCEND_ATTENTION)
        if multi_token:
            query_len = rng.randint(2, 3)
    max_batches = rng.choice(MAX_BATCHES) if rng.random() < 0.5 else rng.randint(2, 64)
    capture_sizes = None
    if max_batches > 1 and rng.random() < 0.25:
        capture_sizes = tuple(sorted(rng.sample(range(1, max_batches + 1), rng.randint(1, min(4, max_batches)))))
    if max_batches > 64 and rng.random() < 0.8:  # mostly the small buckets of a large engine
        num_seqs, steps = rng.randint(5, 40), rng.randint(6, 20)
    elif max_batches > 64:  # the largest buckets: up to every sequence live
        num_seqs, steps = max_batches, FULL_BATCH_STEPS
    else:
        num_seqs, steps = rng.randint(1, max(1, min(max_batches, 24))), rng.randint(6, 20)
        num_seqs = max(num_seqs, min(max_batches, 2))
    sizes = _sizes(vendor, max_batches, capture_sizes)
    if num_seqs == max_batches > 64:  # every sequence live, then batches in the top buckets
        batches = [max_batches] + [rng.randint(max_batches - 16, max_batches) for _ in range(steps - 1)]
    else:
        batches = _batch_sizes(rng, sizes, num_seqs, steps)
    plan = tuple(tuple(sorted(rng.sample(range(num_seqs), n))) for n in batches)
    every = rng.randint(3, 8)

    def new_prompt() -> tuple[int, ...]:
        return tuple(rng.randrange(1, 256) for _ in range(rng.randint(1, 30)))

    replacements = tuple((step, rng.randrange(num_seqs), new_prompt()) for step in range(every - 1, steps - 1, every))
    events = tuple(sorted((rng.randrange(steps - 1), e) for e in EVENTS
                          if steps > 1 and rng.random() < EVENT_CHANCE.get(e, 0.25)
                          and (e != "overlap_next" or query_len == 1)))
    return Case(seed=seed, vendor=vendor, generation=generation, attention=attention, query_len=query_len,
                max_batches=max_batches, capture_sizes=capture_sizes, num_seqs=num_seqs, plan=plan,
                replacements=replacements, events=events)


def run_case(c: Case) -> SideBySide:
    """Run one schedule side by side (its ``mismatches`` say what broke)."""
    blocks_needed = c.num_seqs * -(-(30 + len(c.plan) * c.query_len + 1) // tm.TinyConfig.block_size) + 1
    events: dict[int, tuple[str, ...]] = {}
    for step, event in c.events:
        events[step] = (*events.get(step, ()), event)
    return run(c.vendor, c.seed, generation=c.generation, attention=c.attention or "fia", steps=len(c.plan),
               num_seqs=c.num_seqs, max_batches=c.max_batches, query_len=c.query_len,
               capture_sizes=list(c.capture_sizes) if c.capture_sizes else None,
               plan=[list(a) for a in c.plan],
               replacements={step: (slot, list(p)) for step, slot, p in c.replacements}, events=events,
               num_blocks=max(tm.TinyConfig.num_blocks, blocks_needed + len(c.replacements) * 2))


__all__ = ["Case", "case", "run_case"]
