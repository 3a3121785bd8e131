"""The simulated device runtime: configuration, counters, streams, events, memory pools and graphs.

Everything here is process-global (one simulated device, ``npu:0``) except the current stream, which is each
thread's own (as in torch). Threads may issue work, one op at a time (the GIL); the one thing the device side
refuses from two threads is two task updates open at once (``graph_task_update_begin`` fails the second, as
torch_npu 2.10.0.post2 on CANN 9.0.1 does), which ``NPUGraph.update`` also goes through.

Execution model
---------------
Device work is *deferred*: an op issued on a stream becomes a task in that stream's FIFO queue. A queue
runs in order until its head is an event wait whose event has not been recorded; then it holds until
another stream records that event. ``config.eager_drain`` (default True) runs the queues as far as they
can go right after each op, which for a program without blocked streams is plain eager execution.
With ``eager_drain=False`` nothing runs until a sync point (a host read of device data, a blocking
copy, ``synchronize()``), so a test can observe host-side races against device work.

A graph capture turns the ops issued on the capturing stream into graph nodes instead of tasks; a
replay enqueues one task that walks the graph's nodes on the replay stream, stopping (and holding the
stream) at a captured external-event wait that is not satisfied.

A task may also wait on something outside the process (a collective's peers, :mod:`._hccl`): it holds its
queue while it cannot go on, every drain polls it, and a sync point that has nothing else to run blocks on
it (its ``block()``) instead of declaring a deadlock; ``Event.query()`` and ``Stream.query()`` poll too, as
a device makes progress by itself.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch


class SimCaptureError(RuntimeError):
    """An operation that is illegal during graph capture (a device-to-host sync, a bad capture state)."""


class SimDeadlockError(RuntimeError):
    """A sync point can never complete: a stream waits on an event nothing will record."""


@dataclasses.dataclass
class SimConfig:
    """Process-wide switches of the simulator. Change them in tests (restore afterwards)."""

    #: Run the stream queues as far as possible after every device op (True), or only at sync points.
    eager_drain: bool = True
    #: SUSPECTED (torch_npu_api.md §4.1): a task captured with NPUGraph auto_dispatch_capture waits on
    #: its ExternalEvent at every replay, so a replay without a matching ``update()`` holds the stream.
    #: False: captured ExternalEvent waits never block at replay.
    external_event_blocks_replay: bool = True
    #: SUSPECTED (torch_npu_api.md §4.2): G2a's plain-name branch ``"npu_fused_infer_attention_score"``
    #: never matches a ``.default`` call (``OpOverload.__name__`` carries the overload), so on G2a an
    #: FIA ``.default`` call is not recorded and ``update()`` silently does nothing. True: G2a also
    #: intercepts ``.default`` (as if the branch matched).
    g2a_plain_name_matches_default: bool = False
    #: CANN version the FA3 ``should_handle`` hook compares against (G4+; FA3 needs >= 9.1.0).
    cann_version: tuple[int, ...] = (9, 1, 0)
    #: Fill fresh allocations (``torch.empty`` and every buffer allocated for a deferred or captured
    #: op) with poison: NaN for floats, iinfo.max for integers, True for bools.
    poison: bool = True
    #: Refuse capture on the default stream in the CUDA-style API (CUDA does); the NPU rule is unknown.
    cuda_forbid_default_stream_capture: bool = True


config = SimConfig()


class Counters:
    """Device operations issued outside any graph (what a replay step costs on the host side).

    ``device_ops`` counts every op issued to a stream eagerly: kernels, copies in either direction,
    factory fills, graph replays, task updates; not views, not allocations, not event records/waits.
    ``by_op`` breaks it down by op name. ``replays``, ``h2d``, ``d2h``, ``syncs`` (host waits on device
    work) and ``events`` are finer counts; ``captured`` counts nodes recorded into graphs.
    """

    __slots__ = ("device_ops", "by_op", "replays", "h2d", "d2h", "syncs", "events", "captured", "updates")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.device_ops = 0
        self.by_op: collections.Counter[str] = collections.Counter()
        self.replays = 0
        self.h2d = 0
        self.d2h = 0
        self.syncs = 0
        self.events = 0
        self.captured = 0
        self.updates = 0

    def snapshot(self) -> dict[str, Any]:
        return {name: (dict(getattr(self, name)) if name == "by_op" else getattr(self, name))
                for name in self.__slots__}

    def __repr__(self) -> str:
        return f"Counters({self.snapshot()})"


counters = Counters()

# --------------------------------------------------------------------------------------------------
# poison and allocation

_POISON: dict[torch.dtype, Any] = {}


def poison_value(dtype: torch.dtype) -> Any:
    value = _POISON.get(dtype)
    if value is None:
        if dtype.is_floating_point or dtype.is_complex:
            value = float("nan")
        elif dtype == torch.bool:
            value = True
        else:
            value = torch.iinfo(dtype).max
        _POISON[dtype] = value
    return value


def poison_(t: torch.Tensor) -> torch.Tensor:
    if config.poison and t.numel():
        t.fill_(poison_value(t.dtype))
    return t


_ALIGN = 512
_SEGMENT = 2 << 20


class Block:
    """A range of a pool segment owned by the device tensors that view it.

    When the last SimTensor holding it dies, the range returns to its pool, where a later allocation
    made during a capture into that pool may reuse it: the simulator reproduces address reuse inside a
    graph memory pool (a graph replay may then overwrite memory another graph's output lives in).
    """

    __slots__ = ("pool", "segment", "offset", "size", "__weakref__")

    def __init__(self, pool: Pool, segment: int, offset: int, size: int) -> None:
        self.pool, self.segment, self.offset, self.size = pool, segment, offset, size

    def __del__(self) -> None:
        try:
            self.pool._release(self.segment, self.offset, self.size)
        except Exception:  # interpreter shutdown
            pass


class Pool:
    """A graph memory pool: segments of host memory handed out first-fit, ranges reused once freed."""

    _ids = itertools.count(1)

    def __init__(self, handle: tuple[int, int] | None = None) -> None:
        self.handle: tuple[int, int] = (0, next(Pool._ids)) if handle is None else handle
        _ISSUED.add(self.handle)
        self.segments: list[torch.Tensor] = []
        self._free: list[list[int]] = []  # [segment, offset, size], sorted
        self.allocated_bytes = 0
        self.allocations = 0

    @property
    def reserved_bytes(self) -> int:
        return sum(s.numel() for s in self.segments)

    def allocate(self, size: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype
                 ) -> tuple[torch.Tensor, Block | None]:
        itemsize = dtype.itemsize
        span = 1 + sum((n - 1) * s for n, s in zip(size, stride, strict=False)) if all(size) else 0
        nbytes = span * itemsize
        if nbytes == 0:
            return torch.empty_strided(size, stride, dtype=dtype), None
        rounded = -(-nbytes // _ALIGN) * _ALIGN
        segment, offset = self._take(rounded)
        raw = self.segments[segment][offset:offset + nbytes]
        inner = raw.view(dtype).as_strided(size, stride)
        self.allocated_bytes += rounded
        self.allocations += 1
        return inner, Block(self, segment, offset, rounded)

    def _take(self, nbytes: int) -> tuple[int, int]:
        for i, (segment, offset, size) in enumerate(self._free):
            if size >= nbytes:
                if size == nbytes:
                    del self._free[i]
                else:
                    self._free[i] = [segment, offset + nbytes, size - nbytes]
                return segment, offset
        self.segments.append(torch.empty(max(nbytes, _SEGMENT), dtype=torch.uint8))
        segment = len(self.segments) - 1
        if self.segments[segment].numel() > nbytes:
            self._insert(segment, nbytes, self.segments[segment].numel() - nbytes)
        return segment, 0

    def _release(self, segment: int, offset: int, size: int) -> None:
        self.allocated_bytes -= size
        self._insert(segment, offset, size)

    def _insert(self, segment: int, offset: int, size: int) -> None:
        free = self._free
        free.append([segment, offset, size])
        free.sort()
        merged: list[list[int]] = []
        for block in free:
            if merged and merged[-1][0] == block[0] and merged[-1][1] + merged[-1][2] == block[1]:
                merged[-1][2] += block[2]
            else:
                merged.append(block)
        self._free = merged

    def __repr__(self) -> str:
        return (f"Pool(handle={self.handle}, reserved={self.reserved_bytes}, allocated={self.allocated_bytes}, "
                f"allocations={self.allocations})")


_POOLS: weakref.WeakValueDictionary[tuple[int, int], Pool] = weakref.WeakValueDictionary()
_ISSUED: set[tuple[int, int]] = set()  # every handle ever handed out


def new_pool_handle() -> tuple[int, int]:
    """A fresh pool handle (what ``graph_pool_handle()`` returns); the pool lives while a graph uses it."""
    pool = Pool()
    _POOLS[pool.handle] = pool
    _PENDING_POOLS[pool.handle] = pool  # kept alive until the first graph adopts it
    return pool.handle


_PENDING_POOLS: dict[tuple[int, int], Pool] = {}


def pool_of(handle: Any) -> Pool:
    if isinstance(handle, Pool):
        return handle
    handle = tuple(handle) if isinstance(handle, (tuple, list)) else handle
    pool = _POOLS.get(handle)  # type: ignore[arg-type]
    if pool is None:
        if handle not in _ISSUED:
            raise RuntimeError(f"unknown graph memory pool handle {handle!r}: use graph_pool_handle() or graph.pool()")
        # Like torch's caching allocator: a handle whose graphs are all gone starts a fresh pool.
        pool = Pool(handle)
    return pool


def allocate(size: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype, pool: Pool | None
             ) -> tuple[torch.Tensor, Block | None]:
    """Device memory for an op output: from ``pool`` during capture, plain host memory otherwise; poisoned."""
    if pool is None:
        inner, block = torch.empty_strided(size, stride, dtype=dtype), None
    else:
        inner, block = pool.allocate(tuple(size), tuple(stride), dtype)
    if config.poison and inner.numel():
        inner.fill_(poison_value(dtype))
    return inner, block


# --------------------------------------------------------------------------------------------------
# tasks and graph nodes


class Task:
    """Work in a stream queue or a graph. ``run()`` returns False when it must hold the queue."""

    __slots__ = ()

    def run(self) -> bool:
        raise NotImplementedError

    def describe(self) -> str:
        return type(self).__name__


class OpNode(Task):
    """One recorded device op: the op, its frozen arguments, and the buffers its fresh results go to."""

    __slots__ = ("func", "args", "kwargs", "outs", "name")

    def __init__(self, func: Callable[..., Any], args: tuple | list, kwargs: dict, outs: list | None,
                 name: str) -> None:
        self.func, self.args, self.kwargs, self.outs, self.name = func, args, kwargs, outs, name

    def run(self) -> bool:
        result = self.func(*self.args, **self.kwargs)
        outs = self.outs
        if outs:
            if len(outs) == 1 and isinstance(result, torch.Tensor):
                outs[0].copy_(result)
            else:
                for buf, value in zip(outs, _flat_tensors(result), strict=False):
                    if buf is not None:
                        buf.copy_(value)
        return True

    def describe(self) -> str:
        return self.name


def _flat_tensors(result: Any) -> Iterator[Any]:
    if isinstance(result, (tuple, list)):
        for item in result:
            yield from _flat_tensors(item)
    else:
        yield result


class GroupNode(Task):
    """A task group (``graph_task_group_begin/end``): nodes an update may replace as a whole."""

    __slots__ = ("nodes", "graph", "updates")

    def __init__(self, graph: SimGraph) -> None:
        self.nodes: list[Task] = []
        self.graph = graph
        self.updates = 0

    def run(self) -> bool:
        for node in self.nodes:
            node.run()
        return True

    def describe(self) -> str:
        return "task_group[" + ", ".join(n.describe() for n in self.nodes) + "]"


class TaskGroupHandle:
    """What ``graph_task_group_end`` returns and ``graph_task_update_begin`` takes."""

    __slots__ = ("group",)

    def __init__(self, group: GroupNode) -> None:
        self.group = group

    def __repr__(self) -> str:
        return f"<TaskGroupHandle {self.group.describe()}>"


class UpdateTask(Task):
    """Replace a task group's recorded work (the stream op behind ``graph_task_update_end``)."""

    __slots__ = ("group", "nodes")

    def __init__(self, group: GroupNode, nodes: list[Task]) -> None:
        self.group, self.nodes = group, nodes

    def run(self) -> bool:
        self.group.nodes = self.nodes
        self.group.updates += 1
        return True

    def describe(self) -> str:
        return f"task_update[{', '.join(n.describe() for n in self.nodes)}]"


class EventRecord(Task):
    __slots__ = ("event", "epoch")

    def __init__(self, event: Event, epoch: int) -> None:
        self.event, self.epoch = event, epoch

    def run(self) -> bool:
        ev = self.event
        if self.epoch > ev._done:
            ev._done = self.epoch
        ev._pending -= 1
        return True

    def describe(self) -> str:
        return f"record({self.event!r})"


class _GraphEventRecord(Task):
    """An event record captured in a graph: at replay it completes every record issued so far."""

    __slots__ = ("event",)

    def __init__(self, event: Event) -> None:
        self.event = event

    def run(self) -> bool:
        self.event._done = self.event._issued
        return True

    def describe(self) -> str:
        return f"record({self.event!r})"


class EventWait(Task):
    __slots__ = ("event", "epoch")

    def __init__(self, event: Event, epoch: int) -> None:
        self.event, self.epoch = event, epoch

    def run(self) -> bool:
        return self.event._done >= self.epoch

    def describe(self) -> str:
        return f"wait({self.event!r})"


class ExternalRecord(Task):
    __slots__ = ("event",)

    def __init__(self, event: ExternalEvent) -> None:
        self.event = event

    def run(self) -> bool:
        self.event._recorded = True
        return True

    def describe(self) -> str:
        return f"record({self.event!r})"


class ExternalReset(Task):
    __slots__ = ("event",)

    def __init__(self, event: ExternalEvent) -> None:
        self.event = event

    def run(self) -> bool:
        self.event._recorded = False
        return True

    def describe(self) -> str:
        return f"reset({self.event!r})"


class ExternalWait(Task):
    __slots__ = ("event", "in_graph")

    def __init__(self, event: ExternalEvent, in_graph: bool) -> None:
        self.event, self.in_graph = event, in_graph

    def run(self) -> bool:
        if self.in_graph and not config.external_event_blocks_replay:
            return True
        return self.event._recorded

    def describe(self) -> str:
        return f"wait({self.event!r})"


class CallTask(Task):
    """Run a host closure in stream order (the deferred half of a copy or a factory fill)."""

    __slots__ = ("fn", "name")

    def __init__(self, fn: Callable[[], Any], name: str) -> None:
        self.fn, self.name = fn, name

    def run(self) -> bool:
        self.fn()
        return True

    def describe(self) -> str:
        return self.name


class GraphExec(Task):
    """One replay of a graph on a stream: walks the nodes, holding at an unsatisfied wait."""

    __slots__ = ("graph", "nodes", "pc")

    def __init__(self, graph: SimGraph) -> None:
        self.graph, self.nodes, self.pc = graph, graph.nodes, 0

    def run(self) -> bool:
        nodes, i, n = self.nodes, self.pc, len(self.nodes)
        guard = torch._C._InferenceMode(True)
        try:
            while i < n:
                if not nodes[i].run():
                    self.pc = i
                    return False
                i += 1
        finally:
            del guard
        self.pc = n
        return True

    def describe(self) -> str:
        head = self.nodes[self.pc].describe() if self.pc < len(self.nodes) else "-"
        return f"replay of {self.graph!r} at node {self.pc} ({head})"


class _Deferred(Task):
    """An eagerly issued op that could not run at once: runs later, in inference mode."""

    __slots__ = ("node",)

    def __init__(self, node: Task) -> None:
        self.node = node

    def run(self) -> bool:
        guard = torch._C._InferenceMode(True)
        try:
            return self.node.run()
        finally:
            del guard

    def describe(self) -> str:
        return self.node.describe()


# --------------------------------------------------------------------------------------------------
# streams and capture state


class CaptureState:
    __slots__ = ("graph", "mode", "group", "invalid", "origin")

    def __init__(self, graph: SimGraph, mode: str, origin: Stream) -> None:
        self.graph, self.mode, self.origin = graph, mode, origin
        self.group: GroupNode | None = None
        self.invalid: str | None = None

    def add(self, node: Task) -> None:
        if self.invalid is not None:
            raise SimCaptureError(f"the capture was invalidated by an earlier error: {self.invalid}")
        (self.group.nodes if self.group is not None else self.graph.nodes).append(node)
        counters.captured += 1


class UpdateScope:
    """Between ``graph_task_update_begin`` and ``_end``: ops issued on the stream become the group's new work."""

    __slots__ = ("group", "nodes", "outs")

    def __init__(self, group: GroupNode) -> None:
        self.group = group
        self.nodes: list[Task] = []
        self.outs: list[Any] | None = None  # when set: re-issued fresh results go to these buffers


class Stream:
    """A simulated device stream: an ordered queue of deferred device work."""

    _ids = itertools.count(0)

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.stream_id = next(Stream._ids)
        self.priority = priority
        self.device_index = 0
        self.queue: collections.deque[Task] = collections.deque()
        self.capture: CaptureState | None = None
        self.update: UpdateScope | None = None

    # torch-style API ----------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return torch.device(_state.device_type, 0)

    def wait_event(self, event: Event) -> None:
        event.wait(self)

    def wait_stream(self, stream: Stream) -> None:
        self.wait_event(stream.record_event())

    def record_event(self, event: Event | None = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def query(self) -> bool:
        if self.queue and config.eager_drain:
            drain_all()  # work held only by something outside (a collective's peers) moves on by itself
        return not self.queue

    def synchronize(self) -> None:
        sync_stream(self, "Stream.synchronize()")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.stream_id == self.stream_id

    def __hash__(self) -> int:
        return hash(("sim-stream", self.stream_id))

    def __repr__(self) -> str:
        return f"<sim Stream {self.stream_id}{' (default)' if self.stream_id == 0 else ''}>"


class _State:
    __slots__ = ("_local", "default", "pending", "captures", "device_type", "open_update")

    def __init__(self) -> None:
        self.default = Stream()
        self._local = threading.local()  # the current stream is each thread's own, as in torch
        self.pending: dict[Stream, None] = {}  # streams with non-empty queues, in order
        self.captures: list[CaptureState] = []
        self.device_type = "npu"
        # (thread id, stream) of the task update open in this process: torch_npu has one at a time
        self.open_update: tuple[int, Stream] | None = None

    @property
    def current(self) -> Stream:
        return getattr(self._local, "stream", None) or self.default

    @current.setter
    def current(self, stream: Stream) -> None:
        self._local.stream = stream


_state = _State()


def state() -> _State:
    return _state


def current_stream() -> Stream:
    return _state.current


def default_stream() -> Stream:
    return _state.default


def set_stream(stream: Stream) -> None:
    if not isinstance(stream, Stream):
        raise TypeError(f"expected a simulated Stream, got {type(stream).__name__}")
    _state.current = stream


class stream_context:
    """``with stream(s):`` — make ``s`` the current stream (None: no change)."""

    def __init__(self, stream: Stream | None) -> None:
        self.stream = stream
        self.saved: Stream | None = None

    def __enter__(self) -> Stream | None:
        if self.stream is not None:
            self.saved = _state.current
            set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc: Any) -> None:
        if self.saved is not None:
            _state.current = self.saved


# The device runs its queues for one host thread at a time (work a task runs may issue more: reentrant).
_device = threading.RLock()


def enqueue(stream: Stream, task: Task) -> None:
    """Issue ``task`` on ``stream`` (eager mode: run what can run now)."""
    with _device:
        stream.queue.append(task)
        _state.pending[stream] = None
        if config.eager_drain:
            drain_all()


def _run_queue(stream: Stream) -> bool:
    """Run ``stream``'s queue until empty or blocked. True when something ran."""
    queue = stream.queue
    progressed = False
    while queue:
        head = queue[0]
        if isinstance(head, GraphExec):
            pc = head.pc
            if head.run():
                queue.popleft()
                progressed = True
            else:
                progressed = progressed or head.pc != pc
                break
        elif head.run():
            queue.popleft()
            progressed = True
        else:
            break
    if not queue:
        _state.pending.pop(stream, None)
    return progressed


def drain_all() -> None:
    """Run every queue as far as it can go (until each is empty or blocked)."""
    pending = _state.pending
    progressed = True
    with _device:
        while progressed and pending:
            progressed = False
            for stream in list(pending):
                if _run_queue(stream):
                    progressed = True


def _check_sync_allowed(what: str, stream: Stream | None) -> None:
    if stream is not None and stream.capture is not None:
        _invalidate(stream.capture, f"{what} during graph capture")
    for capture in _state.captures:
        if capture.mode != "relaxed":
            _invalidate(capture, f"{what} while a graph capture (capture_error_mode={capture.mode!r}) is active")


def _invalidate(capture: CaptureState, reason: str) -> None:
    message = (f"{reason}: a device-to-host sync cannot be captured. Move it out of the captured region "
               "(keep host values on the host, or read them before capture_begin).")
    if capture.invalid is None:
        capture.invalid = message
        capture.graph._abort(message)
    raise SimCaptureError(message)


def sync_stream(stream: Stream, what: str) -> None:
    """Host waits until ``stream``'s queue is empty, running other streams only as long as it is blocked."""
    _check_sync_allowed(what, stream)
    counters.syncs += 1
    _drain_until(lambda: not stream.queue, what, stream)


def sync_device(what: str = "synchronize()") -> None:
    _check_sync_allowed(what, None)
    counters.syncs += 1
    _drain_until(lambda: not _state.pending, what, None)


def sync_current(what: str) -> None:
    """A host read of device data: wait for the current stream's queued work."""
    stream = _state.current
    if stream.capture is not None or _state.captures:
        _check_sync_allowed(what, stream)
    counters.syncs += 1
    if stream.queue:
        _drain_until(lambda: not stream.queue, what, stream)


def _drain_until(done: Callable[[], bool], what: str, first: Stream | None) -> None:
    with _device:
        _drain_locked(done, what, first)


def _drain_locked(done: Callable[[], bool], what: str, first: Stream | None) -> None:
    while not done():
        progressed = _run_queue(first) if first is not None and first.queue else False
        if done():
            return
        for stream in list(_state.pending):
            if stream is not first and _run_queue(stream):
                progressed = True
        if not progressed and not done():
            if _wait_outside():
                continue
            raise SimDeadlockError(f"{what} would wait forever: " + describe_blocked())


def _wait_outside() -> bool:
    """Block until a queue head that waits on something outside this process (a collective's peers: a task with a
    ``block()`` method, also as the node a replay holds at) can go on. False when no head waits on anything
    outside: nothing will ever move (a deadlock)."""
    for stream in list(_state.pending):
        if not stream.queue:
            continue
        head = stream.queue[0]
        if isinstance(head, GraphExec):
            head = head.nodes[head.pc] if head.pc < len(head.nodes) else None
        block = getattr(head, "block", None)
        if block is not None and block():
            return True
    return False


def describe_blocked() -> str:
    parts = []
    for stream in _state.pending:
        head = stream.queue[0].describe() if stream.queue else "-"
        parts.append(f"{stream!r} holds at {head} ({len(stream.queue)} queued)")
    hint = (" A captured ExternalEvent wait holds a replay until the event is recorded: with NPUGraph "
            "auto_dispatch_capture every replay needs a matching update() (or set "
            "sim.config.external_event_blocks_replay = False).")
    return "; ".join(parts) + "." + hint


def discard_queued_work() -> list[str]:
    """Drop every stream's queued work, abort any capture left open and make the default stream current.

    What a failed check leaves behind (a replay held at a wait, a capture its caller never ended) would
    otherwise stall or fail whatever runs next in the process. Returns what was dropped, for reporting.
    """
    dropped = [f"{stream!r}: {task.describe()}" for stream in _state.pending for task in stream.queue]
    for stream in list(_state.pending):
        stream.queue.clear()
    _state.pending.clear()
    for capture in list(_state.captures):
        dropped.append(f"open capture of {capture.graph!r}")
        capture.graph._leave_capture()
        capture.graph._abort("discarded: its capture was left open")
    _state.captures.clear()
    _state.current = _state.default
    _state.open_update = None
    return dropped


def pending_work() -> dict[Stream, list[str]]:
    """What is queued on each stream (for tests and error messages)."""
    return {s: [t.describe() for t in s.queue] for s in _state.pending}


# --------------------------------------------------------------------------------------------------
# events


class Event:
    """A stream event (CUDA semantics: a wait targets the latest record issued before it)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing, self.blocking, self.interprocess = enable_timing, blocking, interprocess
        self._issued = 0  # records issued
        self._done = 0  # records executed
        self._pending = 0
        self._capture: CaptureState | None = None  # recorded inside this capture

    def record(self, stream: Stream | None = None) -> None:
        stream = _state.current if stream is None else stream
        counters.events += 1
        capture = stream.capture
        if capture is not None:
            self._capture = capture
            capture.add(_GraphEventRecord(self))
            return
        self._capture = None
        self._issued += 1
        self._pending += 1
        enqueue(stream, EventRecord(self, self._issued))

    def wait(self, stream: Stream | None = None) -> None:
        stream = _state.current if stream is None else stream
        counters.events += 1
        if self._capture is not None and self._capture.graph.capturing:
            capture = self._capture
            if stream.capture is None:  # fork: the waiting stream joins the capture
                stream.capture = capture
                capture.graph._joined.append(stream)
            return
        if stream.capture is not None:
            if self._issued == 0:
                return
            raise SimCaptureError(
                f"{stream!r} is capturing and waits on {self!r}, recorded outside the capture: a graph can "
                "only wait on events recorded inside the same capture (use ExternalEvent for host-driven "
                "dependencies)")
        if self._issued:
            enqueue(stream, EventWait(self, self._issued))

    def query(self) -> bool:
        if self._done < self._issued and config.eager_drain:
            drain_all()  # work held only by something outside (a collective's peers) moves on by itself
        return self._done >= self._issued

    def synchronize(self) -> None:
        _check_sync_allowed("Event.synchronize()", None)
        counters.syncs += 1
        _drain_until(self.query, "Event.synchronize()", None)

    def elapsed_time(self, end_event: Event) -> float:
        return 0.0

    def __repr__(self) -> str:
        return f"<sim Event {id(self):#x} issued={self._issued} done={self._done}>"


class ExternalEvent:
    """An event a stream may wait on before it is recorded; ``reset()`` makes it unrecorded again.

    Waits, records and resets are stream operations. Captured into a graph, a wait holds the replaying
    stream until the event is recorded (see ``config.external_event_blocks_replay``).
    """

    def __init__(self) -> None:
        self._recorded = False

    def _issue(self, stream: Stream | None, task: Task) -> None:
        stream = _state.current if stream is None else stream
        counters.events += 1
        if stream.capture is not None:
            stream.capture.add(task)
        else:
            enqueue(stream, task)

    def record(self, stream: Stream | None = None) -> None:
        self._issue(stream, ExternalRecord(self))

    def wait(self, stream: Stream | None = None) -> None:
        target = _state.current if stream is None else stream
        self._issue(stream, ExternalWait(self, in_graph=target.capture is not None))

    def reset(self, stream: Stream | None = None) -> None:
        self._issue(stream, ExternalReset(self))

    def query(self) -> bool:
        return self._recorded

    def __repr__(self) -> str:
        return f"<sim ExternalEvent {id(self):#x} recorded={self._recorded}>"


# --------------------------------------------------------------------------------------------------
# graphs


class SimGraph:
    """A captured device graph: recorded nodes over static tensors, a memory pool, replay on a stream."""

    _ids = itertools.count(1)

    def __init__(self) -> None:
        self.graph_id = next(SimGraph._ids)
        self.nodes: list[Task] = []
        self.status = "new"  # new | capturing | captured | aborted
        self.pool: Pool | None = None
        self.replays = 0
        self.abort_reason: str | None = None
        self._capture: CaptureState | None = None
        self._joined: list[Stream] = []

    @property
    def capturing(self) -> bool:
        return self.status == "capturing"

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global", stream: Stream | None = None
                      ) -> None:
        if capture_error_mode not in ("global", "thread_local", "relaxed"):
            raise RuntimeError(f"Unknown capture error mode. Expected `global`, `thread_local`, or `relaxed`, "
                               f"got {capture_error_mode!r}")
        if self.status in ("capturing", "captured"):
            raise RuntimeError(f"graph {self.graph_id} is already {self.status}: call reset() before capturing again")
        stream = _state.current if stream is None else stream
        if stream.capture is not None:
            raise RuntimeError(f"{stream!r} is already capturing a graph")
        if stream.update is not None:
            raise RuntimeError(f"{stream!r} is inside graph_task_update_begin/end")
        self.pool = Pool() if pool is None else pool_of(pool)
        _POOLS[self.pool.handle] = self.pool
        _PENDING_POOLS.pop(self.pool.handle, None)
        self.nodes = []
        self.status = "capturing"
        self.abort_reason = None
        capture = CaptureState(self, capture_error_mode, stream)
        self._capture = capture
        self._joined = [stream]
        stream.capture = capture
        _state.captures.append(capture)

    def capture_end(self) -> None:
        capture = self._capture
        if capture is None:
            if self.status == "aborted":
                raise SimCaptureError(f"graph capture failed: {self.abort_reason}")
            raise RuntimeError("capture_end() without capture_begin()")
        self._leave_capture()
        if capture.invalid is not None:
            self._abort(capture.invalid)
            raise SimCaptureError(f"graph capture failed: {capture.invalid}")
        if capture.group is not None:
            self._abort("graph_task_group_begin() without graph_task_group_end()")
            raise RuntimeError("capture ended inside a task group: call graph_task_group_end() first")
        self.status = "captured"

    def _leave_capture(self) -> None:
        capture = self._capture
        for stream in self._joined:
            if stream.capture is capture:
                stream.capture = None
        self._joined = []
        if capture in _state.captures:
            _state.captures.remove(capture)
        self._capture = None

    def _abort(self, reason: str) -> None:
        """Drop everything recorded: an aborted capture leaves no usable graph."""
        if self.status != "aborted" or self.abort_reason is None:
            self.abort_reason = reason
        self.nodes = []
        self.status = "aborted"

    def replay(self) -> None:
        if self.status != "captured":
            if self.status == "aborted":
                raise SimCaptureError(f"cannot replay: the capture failed ({self.abort_reason}); reset() and "
                                      "capture again")
            raise RuntimeError(f"cannot replay graph {self.graph_id}: it is {self.status}, not captured")
        stream = _state.current
        if stream.capture is not None:
            raise SimCaptureError("replaying a graph inside another graph's capture is not supported")
        counters.replays += 1
        counters.device_ops += 1
        counters.by_op["graph.replay"] += 1
        self.replays += 1
        task = GraphExec(self)
        if not stream.queue and config.eager_drain and task.run():
            return
        enqueue(stream, task)

    def reset(self) -> None:
        if self._capture is not None:
            self._leave_capture()
        self.nodes = []
        self.status = "new"
        self.pool = None

    def pool_handle(self) -> tuple[int, int]:
        if self.pool is None:
            raise RuntimeError("the graph has no memory pool before capture_begin()")
        return self.pool.handle

    def describe(self) -> list[str]:
        """The recorded nodes, one line each (for debugging and tests)."""
        return [node.describe() for node in self.nodes]

    def __repr__(self) -> str:
        return f"<SimGraph {self.graph_id} {self.status}, {len(self.nodes)} nodes>"


# --------------------------------------------------------------------------------------------------
# task groups


def task_group_begin(stream: Stream) -> None:
    capture = stream.capture
    if capture is None:
        raise RuntimeError("graph_task_group_begin: the stream is not capturing")
    if capture.group is not None:
        raise RuntimeError("graph_task_group_begin: task groups cannot nest")
    group = GroupNode(capture.graph)
    capture.add(group)
    capture.group = group


def task_group_end(stream: Stream) -> TaskGroupHandle:
    capture = stream.capture
    if capture is None or capture.group is None:
        raise RuntimeError("graph_task_group_end without graph_task_group_begin on this stream")
    group = capture.group
    capture.group = None
    return TaskGroupHandle(group)


def task_update_begin(stream: Stream, handle: TaskGroupHandle) -> None:
    if not isinstance(handle, TaskGroupHandle):
        raise TypeError(f"graph_task_update_begin expects a task group handle, got {type(handle).__name__}")
    if stream.capture is not None:
        raise RuntimeError("graph_task_update_begin on a capturing stream")
    me = threading.get_ident()
    if _state.open_update is not None and _state.open_update[0] != me:
        raise RuntimeError(f"graph_task_update_begin: another thread of this process has a task update open (on "
                           f"{_state.open_update[1]!r}); the device takes one at a time (torch_npu 2.10.0.post2 on "
                           f"CANN 9.0.1 fails the second): serialise graph updates within the process")
    if stream.update is not None:
        raise RuntimeError("graph_task_update_begin: an update is already open on this stream")
    _state.open_update = (me, stream)
    stream.update = UpdateScope(handle.group)
    time.sleep(0)  # the device call lets other threads run, as torch_npu's releases the GIL


def task_update_end(stream: Stream) -> None:
    scope = stream.update
    if scope is None:
        raise RuntimeError("graph_task_update_end without graph_task_update_begin on this stream")
    stream.update = None
    _state.open_update = None
    counters.updates += 1
    counters.device_ops += 1
    counters.by_op["graph.task_update"] += 1
    enqueue(stream, UpdateTask(scope.group, scope.nodes))
