"""The step policy every graph runner shares, and the small mechanism interface it drives.

Once per decode step the runner answers :meth:`GraphBackend.view` with a :class:`StepView` (why graph mode
does not serve the step, the batch, the key and its graph); :class:`StepPolicy` decides from that alone
whether the step replays, captures or runs eager, and the backend carries the decision out.
"""

from __future__ import annotations

import logging
import os
import time
from abc import ABCMeta, abstractmethod
from dataclasses import dataclass
from typing import Any

from ..buffers import GraphInputsChanged
from ..config import switches
from ..install import patching
from . import counters, failures
from .counters import GraphStats
from .guard import StaleGraphGuard
from .key import GraphKey
from .shadow import ShadowCheck

logger = logging.getLogger("vendor_graph")

OVERSIZE = "batch above the largest captured size"


class StepMetadata:
    """What a step's ``attn_metadata`` and ``StepContext`` hold before a graph's fill re-binds them to the
    graph's (padded) buffers; :meth:`restore` gives it back, so an eager fallback after a failed capture
    or a refused replay computes on the step's own metadata. Costs a shallow copy of two ``__dict__``s."""

    __slots__ = ("_saved",)

    def __init__(self, *objects: Any):
        self._saved = [(obj, dict(obj.__dict__)) for obj in objects if hasattr(obj, "__dict__")]

    def restore(self) -> None:
        for obj, state in self._saved:
            obj.__dict__.clear()
            obj.__dict__.update(state)


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


@dataclass(frozen=True, slots=True)
class StepView:
    """What a runner answers for one step, once: everything the policy decides on.

    ``skip``: why graph mode does not serve this step (prefill, graph mode off), else None. ``batch``: the
    batch it needs a graph for (under DP the global batch every rank pads to). ``key``: its graph's key,
    None when the batch is above the largest capture size. ``graph``: the key's captured graph (whatever
    the backend replays), None when there is none yet."""

    skip: str | None
    batch: int = 0
    key: GraphKey | None = None
    graph: Any = None


class GraphBackend(metaclass=ABCMeta):  # not ABC: its empty __slots__ would forbid adopting lmdeploy's runner
    """The mechanism of a runner (the runner object itself, which lmdeploy holds): it describes a step,
    captures, replays and releases graphs, and decides nothing."""

    label: str  # "vendor_graph.<vendor>", the prefix of every log line
    model: Any
    ctx_mgr: Any

    @abstractmethod
    def view(self, kwargs: dict[str, Any]) -> StepView:
        """This step as the policy needs it (see :class:`StepView`)."""

    @abstractmethod
    def forward_skipped(self, reason: str, kwargs: dict[str, Any]) -> Any:
        """Run a step that :meth:`view` said graph mode does not serve, for ``reason``."""

    @abstractmethod
    def capture_sizes(self) -> list[int]:
        """The graph batch sizes, ascending."""

    @abstractmethod
    def capture(self, key: GraphKey, kwargs: dict[str, Any]) -> Any:
        """Capture the graph of ``key`` from this step and return the step's outputs; raises
        :class:`CaptureFailed` (or any error) with nothing of the capture left behind."""

    @abstractmethod
    def replay(self, view: StepView, kwargs: dict[str, Any]) -> Any:
        """Fill, refresh the host values the graph holds, replay ``view.graph`` and slice: the step's
        outputs for its real tokens. Raises :class:`~vendor_graph.buffers.GraphInputsChanged` before the
        replay when the graph cannot serve these inputs."""

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
        self._replay_range = f"{backend.label}.replay"
        switches.apply_debug()
        counters.register(backend, self.stats)
        intact = patching.ensure_owned("where a graph runner was built")
        rank, world = counters.process_rank()
        logger.info("%s: graph runner built on rank %d of %d (pid %d); vendor_graph's patches %s", backend.label,
                    rank, world, os.getpid(), "in place" if intact else "restored")

    def step(self, kwargs: dict[str, Any]) -> Any:
        backend = self.backend
        view = backend.view(kwargs)
        if view.skip is not None:
            if switches.DEBUG:
                logger.debug("%s: step outside graph mode (%s)", backend.label, view.skip)
            return backend.forward_skipped(view.skip, kwargs)
        key = view.key
        if key is None:
            return self._oversize(view.batch, kwargs)
        self.stats.decoded(view.batch, key.query_len)
        if self.eager_reasons:
            reason = self.eager_reasons.get(key)
            if reason is not None:
                return self.eager(reason, kwargs)
        if view.graph is None:
            return self._capture(key, kwargs)
        stale = self.guard.check(key, kwargs)
        if stale is not None:
            logger.warning("%s: %s: recapturing %s: %s", backend.label, key,
                           "every graph" if stale.all_graphs else "its graph", stale.reason)
            self.stats.stale(key.padded_batch)
            self.release(None if stale.all_graphs else key)
            return self._capture(key, kwargs)
        return self._replay(view, kwargs)

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

    def _oversize(self, batch: int, kwargs: dict[str, Any]) -> Any:
        backend = self.backend
        largest = backend.capture_sizes()[-1]
        self.stats.decoded(batch, max(1, kwargs["input_ids"].size(-1) // batch))
        if not self._warned_oversize:
            self._warned_oversize = True
            logger.warning("%s: a batch of %d is above the largest captured size %d and ran eager (every such "
                           "step does); raise max_batch_size or add the size to cudagraph_capture_batch_sizes "
                           "to capture it", backend.label, batch, largest)
        return self.eager(OVERSIZE, kwargs)

    def _capture(self, key: GraphKey, kwargs: dict[str, Any]) -> Any:
        backend = self.backend
        patching.ensure_owned("before a capture")  # a graph captured through another's methods is wrong for good
        if self._progress is None and self.stats.replays == self._replays_at_reset:  # lmdeploy's warmup captures
            self._progress = self.stats.progress(len(backend.capture_sizes()))
        # The fill re-binds the step's attn_metadata and StepContext to the graph's buffers: keep the
        # step's own for an eager fallback.
        own = StepMetadata(kwargs.get("attn_metadata"), backend.ctx_mgr.current_context())
        memory_before = backend.device_memory()
        start = time.perf_counter()
        try:
            outputs = backend.capture(key, kwargs)
        except CaptureFailed as exc:
            failures.peers_failed(False)
            return self._capture_failed(key, kwargs, own, exc, exc.__cause__ or exc)
        except Exception as exc:  # noqa: BLE001 - any capture failure: this key runs eager, serving goes on
            backend.release(key)
            failures.peers_failed(False)
            return self._capture_failed(key, kwargs, own, CaptureFailed(str(exc)), exc)
        failed = failures.peers_failed(True)
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

    def _capture_failed(self, key: GraphKey, kwargs: dict[str, Any], own: StepMetadata,
                        failed: CaptureFailed, cause: BaseException) -> Any:
        label = self.backend.label
        if failed.fault:
            reason = failures.capture_failure_reason(cause, failed.hint)
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

    def _replay(self, view: StepView, kwargs: dict[str, Any]) -> Any:
        backend, key = self.backend, view.key
        if self._progress is not None:
            self._end_progress()  # the up-front captures are over
        # The fill re-binds the step's metadata to the graph's buffers: keep the step's own for an eager
        # fallback (a model's own fill may refuse after binding) and for the shadow check.
        own = StepMetadata(kwargs.get("attn_metadata"), backend.ctx_mgr.current_context())
        real_tokens = kwargs["input_ids"].size(-1)
        try:
            with counters.profile_range(self._replay_range, real_tokens // key.query_len, key.padded_batch):
                outputs = backend.replay(view, kwargs)
        except GraphInputsChanged as exc:  # raised by the fill, before the replay: this step runs eager
            own.restore()
            reason = f"inputs differ from the capture: {exc}"
            if reason not in self.stats.eager_steps:
                logger.warning("%s: a step for %s ran eager: %s", backend.label, key, exc)
            return self.eager(reason, kwargs)
        self.stats.replayed(key.padded_batch, real_tokens, key.padded_tokens)
        if switches.DEBUG:
            logger.debug("%s: replayed %s for a batch of %d", backend.label, key, real_tokens // key.query_len)
        if self.shadow.due():
            return self._shadow(key, kwargs, outputs, own)
        return outputs

    def _shadow(self, key: GraphKey, kwargs: dict[str, Any], outputs: Any, own: StepMetadata) -> Any:
        """Run the step eagerly on its own inputs and compare with the replay (vendor_graph.runtime.shadow).
        The eager run writes the same K/V values into the same live slots the replay wrote."""
        label = self.backend.label
        real_batch = kwargs["input_ids"].size(-1) // key.query_len
        own.restore()
        model = self.backend.model
        with counters.profile_range(f"{label}.shadow", real_batch, key.padded_batch):
            eager = model.make_output_buffers(model(**kwargs))
        problem = self.shadow.compare(outputs, eager)
        self.stats.shadowed(key.padded_batch, problem is not None)
        diverged_elsewhere = failures.peers_failed(problem is None)  # every rank checks the same replay
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


__all__ = ["OVERSIZE", "CaptureFailed", "GraphBackend", "StepMetadata", "StepPolicy", "StepView"]
