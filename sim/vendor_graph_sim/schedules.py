"""Seeded random decode schedules over every vendor configuration (the CI suite and tools/soak.py)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from vendor_graph import compat
from vendor_graph.patching import quiet_imports

with quiet_imports():
    from vendor_graph.ascend.releases import GENERATION_FACTS

from .harness import SideBySide, run

ATTENTIONS = ("fia", "fia_v2", "paged_attention")


@dataclass(frozen=True)
class Case:
    seed: int
    vendor: str
    generation: str | None
    attention: str
    num_seqs: int
    steps: int

    def __str__(self) -> str:
        where = f"{self.generation}/{self.attention}" if self.vendor == "ascend" else self.vendor
        return f"seed {self.seed}: {where}, {self.num_seqs} seqs, {self.steps} steps"


def case(seed: int) -> Case:
    """The configuration schedule ``seed`` runs: vendor, generation and attention drawn from the seed."""
    rng = random.Random(seed)
    vendors = compat.vendors_supporting(compat.installed_lmdeploy_version())
    vendor = rng.choice(vendors)
    generation = rng.choice([g for g in GENERATION_FACTS if g != "G0"]) if vendor == "ascend" else None
    return Case(seed=seed, vendor=vendor, generation=generation, attention=rng.choice(ATTENTIONS),
                num_seqs=rng.randint(2, 12), steps=rng.randint(8, 20))


def run_case(c: Case) -> SideBySide:
    """Run one schedule side by side (its ``mismatches`` say what broke)."""
    return run(c.vendor, c.seed, generation=c.generation, attention=c.attention, steps=c.steps,
               num_seqs=c.num_seqs)
