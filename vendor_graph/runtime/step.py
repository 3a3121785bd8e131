"""The one step policy of every graph runner, and the small interface its mechanism implements.

:class:`StepPolicy` decides what a decode step does: which :class:`~vendor_graph.runtime.key.GraphKey` it
takes, whether it replays, captures or runs eager (with the reason), and what follows a stale graph,
a failed capture, inputs the graph cannot serve or a shadow check that disagrees. A
:class:`GraphBackend` carries those decisions out and decides nothing itself.
"""

from __future__ import annotations

import logging
import os
import time
from abc import ABCMeta, abstractmethod
from typing import Any

from ..buffers import GraphInputsChanged
from ..install import patching
from . import counters, faults, ranks, switches
from .counters import GraphStats
from .guard import StaleGraphGuard
from .key import GraphKey
from .shadow import ShadowCheck

logger = logging.getLogger("vendor_graph")

OVERSIZE = "batch above the largest captured size"


class CaptureFailed(Exception):
    """Raised by :meth:`GraphBackend.capture` after it released everything the capture made.

    ``outputs``: the step's result when the backend computed it before failing (its warmup forward),
    else None. ``fault``: False when the key cannot have a correct graph by design (no graph API, host
    values out of the update's reach); its reason is logged as a warning, not counted as a failure.
    ``hint``: the vendor's remedy for the error behind it."""

    def __init__(self, reason: str, *, outputs: Any = None, fault: bool = True, hint: str | None = None):
        super().__init__(reason)
        self.outputs = outputs
        self.fault = fault
        self.hint = hint


class GraphBackend(metaclass=ABCMeta):  # not ABC: its empty __slots__ would forbid adopting lmdeploy's runner
    """What :class:`StepPolicy` needs from a runner's mechanism (the runner object itself, which lmdeploy
    holds): the step's batch and key, and capture / replay / release of the graph of a key."""

    label: str  # "vendor_graph.<vendor>", the prefix of every log line
    model: Any
    ctx_mgr: Any

    @abstractmethod
    def skip_reason(self, kwargs: dict[str, Any]) -> str | None:
        """Why this step is not graph mode's to serve (prefill, graph mode off), or None."""

    @abstractmethod
    def forward_skipped(self, reason: str, kwargs: dict[str, Any]) -> Any:
        """Run a step :meth:`skip_reason` excluded, for ``reason``."""

    @abstractmethod
    def wanted_batch(self, kwargs: dict[str, Any]) -> int:
        """The batch this step needs a graph for (under DP: the global batch every rank pads to)."""

    @abstractmethod
    def capture_sizes(self) -> list[int]:
        """The graph batch sizes, ascending."""

    @abstractmethod
    def graph_key(self, kwargs: dict[str, Any]) -> GraphKey:
        """This step's key, for a batch within the capture sizes."""

    @abstractmethod
    def has_graph(self, key: GraphKey) -> bool: ...

    @abstractmethod
    def capture(self, key: GraphKey, kwargs: dict[str, Any]) -> Any:
        """Capture the graph of ``key`` from this step and return the step's outputs; raises
        :class:`CaptureFailed` (or any error) with nothing of the capture left behind."""

    @abstractmethod
    def replay(self, key: GraphKey, kwargs: dict[str, Any]) -> Any:
        """Fill, refresh the host values the graph holds, replay and slice: the step's outputs for
        its real tokens. Raises :class:`~vendor_graph.buffers.GraphInputsChanged` before replaying
        when the graph cannot serve these inputs."""

    @abstractmethod
    def release(self, key: GraphKey | None) -> None:
        """Free the graph of ``key`` (every graph for None) and what only it used."""

    def device_memory(self) -> int | None:
        """Device memory in use now, for the capture's cost; None where unknown."""
        return None

    # What the runner did, for operators and tests (the policy keeps it).
    policy: StepPolicy

    @property
    def stats(self) -> GraphStats:
        return self.policy.stats

    @property
    def guard(self) -> StaleGraphGuard:
        return self.policy.guard

    def eager_reasons(self) -> dict[GraphKey, str]:
        return dict(self.policy.eager_reasons)


class StepPolicy:
    """``step(kwargs)`` for every vendor_graph runner; it owns the runner's stats, guard and shadow check."""

    def __init__(self, backend: GraphBackend):
        self.backend = backend
        self.stats = GraphStats()
        self.guard = StaleGraphGuard(backend.model)
        self.shadow = ShadowCheck()
        self.eager_reasons: dict[GraphKey, str] = {}
        self._warned_oversize = False
        self._progress: counters.CaptureProgress | None = None
        self._replays_at_reset = 0
        switches.apply_debug()
        counters.register(backend, self.stats)
        intact = patching.ensure_owned("where a graph runner was built")
        rank, world = counters.process_rank()
        logger.info("%s: graph runner built on rank %d of %d (pid %d); vendor_graph's patches %s", backend.label,
                    rank, world, os.getpid(), "in place" if intact else "restored")

    def step(self, kwargs: dict[str, Any]) -> Any:
        backend = self.backend
        patching.ensure_owned("before a graph step")
        reason = backend.skip_reason(kwargs)
        if reason is not None:
            if switches.DEBUG:
                logger.debug("%s: step outside graph mode (%s)", backend.label, reason)
            return backend.forward_skipped(reason, kwargs)
        wanted, largest = backend.wanted_batch(kwargs), backend.capture_sizes()[-1]
        if wanted > largest:
            self.stats.decoded(wanted, max(1, kwargs["input_ids"].size(-1) // wanted))
            if not self._warned_oversize:
                self._warned_oversize = True
                logger.warning("%s: a batch of %d is above the largest captured size %d and ran eager (every such "
                               "step does); raise max_batch_size or add the size to cudagraph_capture_batch_sizes "
                               "to capture it", backend.label, wanted, largest)
            return self.eager(OVERSIZE, kwargs)
        key = backend.graph_key(kwargs)
        self.stats.decoded(wanted, key.query_len)
        reason = self.eager_reasons.get(key)
        if reason is not None:
            return self.eager(reason, kwargs)
        if not backend.has_graph(key):
            return self._capture(key, kwargs)
        stale = self.guard.check(key, kwargs)
        if stale is not None:
            logger.warning("%s: %s: recapturing %s: %s", backend.label, key,
                           "every graph" if stale.all_graphs else "its graph", stale.reason)
            self.stats.stale(key.padded_batch)
            self.release(None if stale.all_graphs else key)
            return self._capture(key, kwargs)
        return self._replay(key, kwargs)

    def eager(self, reason: str, kwargs: dict[str, Any]) -> Any:
        """Run a decode step eagerly, counted under ``reason``."""
        self.stats.eager(reason)
        if switches.DEBUG:
            logger.debug("%s: eager step (%s)", self.backend.label, reason)
        model = self.backend.model
        return model.make_output_buffers(model(**kwargs))

    def release(self, key: GraphKey | None) -> None:
        """Drop the graph of ``key`` (every graph for None) with its guard record."""
        self.backend.release(key)
        self.stats.released(key)
        if key is None:
            self.guard.clear()
        else:
            self.guard.forget(key)

    def reset(self) -> None:
        """Forget every graph and eager decision (the runner's own ``reset``: lmdeploy's sleep, weight update
        and pipeline close). The stats stay: they are the run's, and the graphs they counted are only gone."""
        self.release(None)
        self.eager_reasons.clear()
        self._end_progress()
        self._replays_at_reset = self.stats.replays
        if not self.stats.empty():
            logger.debug("%s: graphs released; graph stats of the run so far:\n%s", self.backend.label,
                         self.stats.summary())

    def _end_progress(self) -> None:
        if self._progress is not None:
            self._progress.done()
            self._progress = None

    def _capture(self, key: GraphKey, kwargs: dict[str, Any]) -> Any:
        backend = self.backend
        if self._progress is None and self.stats.replays == self._replays_at_reset:  # lmdeploy's warmup captures
            self._progress = self.stats.progress(len(backend.capture_sizes()))
        # The fill re-binds the step's attn_metadata and StepContext to the graph's buffers: keep the
        # step's own for an eager fallback.
        own = faults.StepMetadata(kwargs.get("attn_metadata"), backend.ctx_mgr.current_context())
        memory_before = backend.device_memory()
        start = time.perf_counter()
        try:
            outputs = backend.capture(key, kwargs)
        except CaptureFailed as exc:
            ranks.peers_failed(False)
            return self._capture_failed(key, kwargs, own, exc, exc.__cause__ or exc)
        except Exception as exc:  # noqa: BLE001 - any capture failure: this key runs eager, serving goes on
            backend.release(key)
            ranks.peers_failed(False)
            return self._capture_failed(key, kwargs, own, CaptureFailed(str(exc)), exc)
        failed = ranks.peers_failed(True)
        if failed:  # this step's outputs are right; the key runs eager from now on, as on the ranks that failed
            backend.release(key)
            reason = (f"capture failed on rank(s) {failed}: this key runs eager on every rank, so their "
                      f"collectives match")
            logger.warning("%s: %s runs eager: %s", backend.label, key, reason)
            self.eager_reasons[key] = reason
            if self._progress is not None:
                self._progress.captured(key.padded_batch)
            return outputs
        seconds = time.perf_counter() - start
        memory_after = backend.device_memory()
        nbytes = None if memory_before is None or memory_after is None else max(0, memory_after - memory_before)
        self.stats.captured(key.padded_batch, seconds, nbytes, key)
        self.guard.record(key, kwargs)
        if self._progress is not None:
            self._progress.captured(key.padded_batch)
        logger.info("%s: captured %s in %.3fs", backend.label, key, seconds)
        return outputs

    def _capture_failed(self, key: GraphKey, kwargs: dict[str, Any], own: faults.StepMetadata,
                        failed: CaptureFailed, cause: BaseException) -> Any:
        label = self.backend.label
        if failed.fault:
            reason = faults.capture_failure_reason(cause, failed.hint)
            self.stats.capture_failed(key.padded_batch)
            logger.error("%s: capturing %s failed; it runs eager from now on (serving continues): %s",
                         label, key, reason, exc_info=cause)
        else:
            reason = str(failed)
            logger.warning("%s: %s runs eager: %s", label, key, reason)
        self.eager_reasons[key] = reason
        if self._progress is not None:
            self._progress.captured(key.padded_batch)
        if failed.outputs is not None:
            return failed.outputs
        own.restore()
        return self.eager(reason, kwargs)

    def _replay(self, key: GraphKey, kwargs: dict[str, Any]) -> Any:
        backend = self.backend
        self._end_progress()  # the up-front captures are over
        own = faults.StepMetadata(kwargs.get("attn_metadata"), backend.ctx_mgr.current_context())
        real_tokens = kwargs["input_ids"].size(-1)
        real_batch = real_tokens // key.query_len
        try:
            with counters.profile_range(f"{backend.label}.replay", real_batch, key.padded_batch):
                outputs = backend.replay(key, kwargs)
        except GraphInputsChanged as exc:  # raised by the fill, before the replay: this step runs eager
            own.restore()
            reason = f"inputs differ from the capture: {exc}"
            if reason not in self.stats.eager_steps:
                logger.warning("%s: a step for %s ran eager: %s", backend.label, key, exc)
            return self.eager(reason, kwargs)
        self.stats.replayed(key.padded_batch, real_tokens, key.padded_tokens)
        if switches.DEBUG:
            logger.debug("%s: replayed %s for a batch of %d", backend.label, key, real_batch)
        if self.shadow.due():
            return self._shadow(key, kwargs, outputs, own)
        return outputs

    def _shadow(self, key: GraphKey, kwargs: dict[str, Any], outputs: Any, own: faults.StepMetadata) -> Any:
        """Run the step eagerly on its own inputs and compare with the replay (vendor_graph.runtime.shadow). The
        eager run writes the same K/V values into the same live slots the replay wrote."""
        label = self.backend.label
        real_batch = kwargs["input_ids"].size(-1) // key.query_len
        own.restore()
        model = self.backend.model
        with counters.profile_range(f"{label}.shadow", real_batch, key.padded_batch):
            eager = model.make_output_buffers(model(**kwargs))
        problem = self.shadow.compare(outputs, eager)
        self.stats.shadowed(key.padded_batch, problem is not None)
        diverged_elsewhere = ranks.peers_failed(problem is None)  # every rank checks the same replay
        if problem is None:
            if diverged_elsewhere and self.shadow.action == "eager":
                reason = (f"shadow check: graph differed from eager on rank(s) {diverged_elsewhere}: this key "
                          f"runs eager on every rank, so their collectives match")
                logger.warning("%s: %s runs eager: %s", label, key, reason)
                self.release(key)
                self.eager_reasons[key] = reason
            return outputs
        if self.shadow.diverged(label, key, real_batch, key.padded_batch, problem):
            self.release(key)
            self.eager_reasons[key] = f"shadow check: graph differed from eager ({problem})"
            return eager
        return outputs


__all__ = ["OVERSIZE", "CaptureFailed", "GraphBackend", "StepPolicy"]
