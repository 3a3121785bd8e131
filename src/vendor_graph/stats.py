"""Counters of what graph mode did: per bucket captures, replays, real vs padded tokens; eager steps
and why. Cheap enough for every step (a few integer additions); one summary table on demand."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class BucketStats:
    captures: int = 0
    replays: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    capture_seconds: float = 0.0
    capture_bytes: int | None = None

    @property
    def padding_waste(self) -> float:
        return 0.0 if not self.padded_tokens else 1 - self.real_tokens / self.padded_tokens


@dataclass
class GraphStats:
    """One runner's counters (a draft model's runner has its own)."""

    buckets: dict[int, BucketStats] = field(default_factory=dict)
    eager_steps: Counter = field(default_factory=Counter)

    def bucket(self, padded_batch: int) -> BucketStats:
        stats = self.buckets.get(padded_batch)
        if stats is None:
            stats = self.buckets[padded_batch] = BucketStats()
        return stats

    def captured(self, padded_batch: int, seconds: float, nbytes: int | None = None) -> None:
        stats = self.bucket(padded_batch)
        stats.captures += 1
        stats.capture_seconds += seconds
        if nbytes is not None:
            stats.capture_bytes = (stats.capture_bytes or 0) + nbytes

    def replayed(self, padded_batch: int, real_tokens: int, padded_tokens: int) -> None:
        stats = self.bucket(padded_batch)
        stats.replays += 1
        stats.real_tokens += real_tokens
        stats.padded_tokens += padded_tokens

    def eager(self, reason: str) -> None:
        self.eager_steps[reason] += 1

    @property
    def replays(self) -> int:
        return sum(b.replays for b in self.buckets.values())

    def summary(self) -> str:
        lines = ["bucket  captures  replays  real tokens  padded tokens  waste   capture s  capture MiB"]
        for size in sorted(self.buckets):
            b = self.buckets[size]
            mib = "-" if b.capture_bytes is None else f"{b.capture_bytes / 2**20:.1f}"
            lines.append(f"{size:>6}  {b.captures:>8}  {b.replays:>7}  {b.real_tokens:>11}  {b.padded_tokens:>13}  "
                         f"{b.padding_waste:>5.1%}  {b.capture_seconds:>9.3f}  {mib:>11}")
        for reason, count in self.eager_steps.most_common():
            lines.append(f"eager steps: {count} ({reason})")
        return "\n".join(lines)
