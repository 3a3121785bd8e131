"""``hccl``: the simulated NPU's process-group backend, HCCL's collectives over gloo on loopback.

lmdeploy on Ascend asks torch.distributed for ``hccl`` (``AscendOpsBackend.ccl_backend()``) in ``new_group`` for
its device groups, beside CPU ``gloo`` groups of its own; its tensor-parallel workers join the default group asking
for ``nccl`` (their device context is not Ascend yet there), which transfer_to_npu, the real one and the
simulator's, turns into ``hccl``. :func:`register` (run by :func:`vendor_graph_sim.device.install`) registers the name
for the simulated device; each group is a :class:`HcclProcessGroup`, which runs every collective on the
simulated device's tensors by staging their contents on the host (a contiguous copy), running gloo on the
copies and copying the result back.

Collectives are device work, in stream order like every other op of the simulator, and asynchronous to the host
as a device's are (:class:`Collective`):

* outside a capture a collective is queued on the current stream and goes as far as it can at once; when its
  stream reaches it (the work queued before it has run) it stages its inputs and starts gloo, and the stream's
  later work waits for it while the host goes on (``work.wait()`` orders streams, it does not block the host;
  lmdeploy's executor relies on that: a rank that blocked in a broadcast would never reach the barrier its
  peer waits at). A host read, a sync or an event query lets it finish; a sync that has nothing else to run
  waits for the peers, at most the group's timeout, and a stream held at a wait nothing will satisfy raises
  :class:`~._runtime.SimDeadlockError` instead of hanging;
* during a capture nothing runs: the collective is recorded into the graph as one task over the tensors it
  was given (static addresses), and every replay runs it again on their contents at that point of the
  replay. Replaying the same graph on every rank therefore issues the same collectives in the same order,
  as replaying an HCCL graph does. ``barrier()`` waits for the device, so it cannot be captured.

A group starts its collectives' data in the order its collectives were reached; collectives of one group
reached from two streams in an order that depends on timing are not modelled (lmdeploy issues a rank's
collectives on one stream).

No collective waits forever: gloo's timeout is the group's, capped at :data:`MAX_TIMEOUT` (lmdeploy asks for
35600 days), and before the data moves the ranks agree on what they issued (one fixed-size gather: the collective,
its element count, dtype and root), so a dead peer or a peer that issued a different collective (other sizes: a
graph on one rank, eager on another) fails it on every rank with an error that names the group and what each rank
issued, where a device would hang. In a worker lmdeploy spawned under vendor_graph (its worker reports folder is
set), a collective whose ranks diverged or timed out tears the process down after leaving the error for the parent,
as torch's NCCL error handling does by default: lmdeploy's worker keeps a failed forward loop's exception to itself
and its engine would wait forever; vendor_graph's watch of the workers then stops the engine with this error.

``_get_backend(device).get_hccl_comm_name(rank)`` (lmdeploy's MoE path asks for it) answers a name; the MoE
communication kernels that would use it are not simulated.

On torch 2.1.0 (the oldest the runtime supports) ``Backend.register_backend`` has the same creator signature
(store, rank, size, timeout) and accepts a ``ProcessGroup`` subclass too, but the simulator itself needs
torch >= 2.4, so this module only runs there.
"""

from __future__ import annotations

import collections
import datetime
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import _runtime as rt
from ._tensor import SimTensor

NAME = "hccl"
#: The longest a collective waits for its peers (gloo's timeout): a group asking for longer gets this.
MAX_TIMEOUT = datetime.timedelta(seconds=180)
LOOPBACK = "127.0.0.1"
logger = logging.getLogger("vendor_graph_sim")


class CollectiveMismatch(RuntimeError):
    """The ranks of a group issued different collectives (kind, element count, dtype or root)."""


def register() -> bool:
    """Register :data:`NAME` with torch.distributed for the simulated device (idempotent); False where this
    torch has no distributed package."""
    import torch.distributed as dist

    if not dist.is_available():
        return False
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, devices=[rt.state().device_type])
    return True


def _create(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> HcclProcessGroup:
    return HcclProcessGroup(store, rank, size, timeout)


def _inner(name: str, tensors: Sequence[Any]) -> list[torch.Tensor]:
    """The device memory (CPU tensors) behind ``tensors``, which must all be on the simulated device."""
    out = []
    for t in tensors:
        if not isinstance(t, SimTensor):
            where = t.device if isinstance(t, torch.Tensor) else type(t).__name__
            raise RuntimeError(f"hccl {name}: every tensor must be on the simulated {rt.state().device_type} device, "
                               f"got one on {where} (use a gloo group for host tensors)")
        out.append(t._inner)
    return out


def _stage(inner: torch.Tensor) -> torch.Tensor:
    """A contiguous host copy of device memory: what gloo reads and writes."""
    return inner.clone(memory_format=torch.contiguous_format)


_KINDS = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor")
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8, torch.int16,
           torch.int32, torch.int64, torch.bool)


def _descriptor(name: str, tensors: Sequence[torch.Tensor], root: int = -1) -> list[int]:
    """What every rank must agree on before the data moves: the collective, its element count, dtype and root."""
    dtype = tensors[0].dtype if tensors else torch.float32
    code = _DTYPES.index(dtype) if dtype in _DTYPES else len(_DTYPES)
    return [_KINDS.index(name), sum(t.numel() for t in tensors), code, root]


def _describe(descriptor: list[int]) -> str:
    kind, numel, code, root = descriptor
    dtype = _DTYPES[code] if code < len(_DTYPES) else "another dtype"
    text = f"{_KINDS[kind] if 0 <= kind < len(_KINDS) else '?'} of {numel} x {dtype}"
    return text + (f" from rank {root}" if root >= 0 else "")


#: ``start()`` of a collective: stage its inputs, start gloo on them, and return the gloo works with what copies
#: the results back once they are done.
Start = Callable[[], "tuple[list[Any], Callable[[], None]]"]


class Collective(rt.Task):
    """One collective on a stream or in a graph: device work that waits on the other ranks, not on the host.

    Reached by its stream (or by a replay, once per replay), it first gathers every rank's descriptor on the
    group's own metadata pair (a fixed size, so gloo never sees mismatched buffers); once that is in, it waits for
    the group's earlier collectives to start their data (each group starts them in the order its collectives were
    reached, the same on every rank), stages its inputs (the stream's earlier work has run), starts gloo on them,
    and, once gloo is done, copies the results back. ``run()`` only polls: while the peers have not come it holds
    its stream, and the host goes on, as with a device collective; a sync point with nothing else to run waits
    in ``block()``, at most the group's timeout.
    """

    __slots__ = ("group", "name", "descriptor", "start", "state", "works", "finish", "meta", "completions")

    def __init__(self, group: HcclProcessGroup, name: str, descriptor: list[int], start: Start) -> None:
        self.group, self.name, self.descriptor, self.start = group, name, descriptor, start
        self.state = "idle"  # idle -> agreeing -> queued -> moving -> idle
        self.works: list[Any] = []
        self.finish: Callable[[], None] | None = None
        self.meta: tuple[Any, torch.Tensor, list[torch.Tensor]] | None = None
        self.completions = 0

    def run(self) -> bool:
        try:
            return self._advance()
        except RuntimeError as exc:
            self._abandon()
            raise self.group._failure(self.name, exc) from exc

    def _advance(self) -> bool:
        group = self.group
        if self.state == "idle":
            self.meta = group._announce(self.descriptor)
            group._order.append(self)
            self.state = "agreeing"
        if self.state == "agreeing":
            work, mine, everyone = self.meta
            if not _finished(work):
                return False
            group._check(mine, everyone)
            self.state = "queued"
        if self.state == "queued":
            if group._order[0] is not self:
                return False
            self.works, self.finish = self.start()
            group._order.popleft()
            self.state = "moving"
        if not all(_finished(w) for w in self.works):
            return False
        self.finish()
        self.state, self.works, self.finish, self.meta = "idle", [], None, None
        self.completions += 1
        return True

    def _abandon(self) -> None:
        if self in self.group._order:
            self.group._order.remove(self)
        self.state, self.works, self.finish, self.meta = "idle", [], None, None

    def block(self) -> bool:
        """Wait for what this collective waits on (its peers), at most the group's timeout; False when it waits on
        nothing outside (an earlier collective of its group, held on another stream)."""
        if self.state == "agreeing":
            pending = [self.meta[0]]
        elif self.state == "moving":
            pending = list(self.works)
        else:
            return False
        try:
            for work in pending:
                work.wait()
        except RuntimeError as exc:
            self._abandon()
            raise self.group._failure(self.name, exc) from exc
        return True

    def describe(self) -> str:
        return f"hccl.{self.name}"


def _finished(work: Any) -> bool:
    """Whether a gloo work is done; raises its error if it failed."""
    if not work.is_completed():
        return False
    work.wait()
    return True


class _Handle(torch.distributed.Work if torch.distributed.is_available() else object):  # type: ignore[misc]
    """The work handle of a collective issued to a stream (or recorded into the capturing graph).

    ``wait()`` does not block the host, as a device collective's does not: it makes the current stream wait for
    the collective's stream (nothing when they are one). ``get_future()`` answers at once; the tensors it names
    are right for work that follows on the collective's stream, or after a sync.
    """

    def __init__(self, result: list[torch.Tensor], task: Collective | None, stream: rt.Stream) -> None:
        super().__init__()
        self._result, self._task, self._stream = result, task, stream

    def wait(self, timeout: Any = None) -> bool:
        current = rt.current_stream()
        if current is not self._stream and current.capture is None and self._stream.capture is None:
            event = rt.Event()
            event.record(self._stream)
            event.wait(current)
        return True

    def is_completed(self) -> bool:
        return self._task is None or self._task.completions > 0

    def is_success(self) -> bool:
        return True

    def exception(self) -> Any:
        return None

    def synchronize(self) -> None:
        rt.sync_stream(self._stream, "synchronize() of an hccl work handle")

    def result(self) -> list[torch.Tensor]:
        return self._result

    def get_future(self) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(self._result)
        return future


def _tear_down_worker(error: RuntimeError) -> None:
    """In a worker lmdeploy spawned under vendor_graph: leave ``error`` for the parent and end the process."""
    from vendor_graph.config import settings
    from vendor_graph.install import workers

    folder = os.environ.get(settings.WORKER_REPORTS)
    if not folder:
        return
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    try:
        workers.report_path(folder, os.getpid()).write_text(" ".join(f"RuntimeError: {error}".split()) + "\n" + text,
                                                             encoding="utf-8")
    except OSError:
        pass
    logger.error("vendor_graph_sim: %s; this worker stops (lmdeploy would keep the error to itself and its engine "
                 "would wait forever)", error)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(1)


def _issue(group: HcclProcessGroup, name: str, start: Start, descriptor: list[int], result: list[torch.Tensor]
           ) -> _Handle:
    """Issue a collective on the current stream: recorded when it captures (each replay runs it again, on the
    tensors' contents at that point), else queued behind the stream's work, going as far as it can now."""
    stream = rt.current_stream()
    if stream.update is not None:
        raise RuntimeError(f"hccl {name} inside graph_task_update_begin/end: a task update cannot re-issue a "
                           "collective")
    task = Collective(group, name, descriptor, start)
    if stream.capture is not None:
        stream.capture.add(task)
        return _Handle(result, None, stream)
    rt.counters.device_ops += 1
    rt.counters.by_op[f"hccl.{name}"] += 1
    rt.enqueue(stream, task)
    return _Handle(result, task, stream)


class HcclProcessGroup(torch.distributed.ProcessGroup if torch.distributed.is_available() else object):  # type: ignore[misc]
    """One ``hccl`` group: its collectives on simulated device tensors, run by two gloo groups of the same ranks
    (one for the descriptors the ranks agree on, one for the data: each keeps its own order)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta) -> None:
        import torch.distributed as dist

        super().__init__(rank, size)
        self.timeout = min(timeout, MAX_TIMEOUT)
        self._meta = self._gloo_group(dist.PrefixStore("sim-hccl/meta/", store), rank, size)
        self._gloo = self._gloo_group(dist.PrefixStore("sim-hccl/data/", store), rank, size)
        self._order: collections.deque[Collective] = collections.deque()  # agreed, data not started yet

    def _gloo_group(self, store: Any, rank: int, size: int) -> Any:
        from torch._C._distributed_c10d import ProcessGroupGloo

        options = ProcessGroupGloo._Options()
        options._devices = [ProcessGroupGloo.create_device(hostname=LOOPBACK)]
        options._timeout = self.timeout
        options._threads = 1
        return ProcessGroupGloo(store, rank, size, options)

    # identity -------------------------------------------------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return NAME

    def name(self) -> str:
        return NAME

    # torch's own reads the name from a registered backend, which a Python group has none of
    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        return getattr(self, "_group_name", "")

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = desc

    @property
    def group_desc(self) -> str:
        return getattr(self, "_group_desc", "")

    def describe(self) -> str:
        return f"group {self.group_name!r} (rank {self.rank()} of {self.size()})"

    def _get_backend(self, device: Any) -> HcclProcessGroup:
        return self

    def get_hccl_comm_name(self, rank: int) -> str:
        return f"sim-hccl-{self.group_name}-{rank}"

    def shutdown(self) -> None:
        for gloo in (self._meta, self._gloo):
            shutdown = getattr(gloo, "shutdown", None)
            if shutdown is not None:
                shutdown()

    abort = shutdown

    # the collectives' machinery ---------------------------------------------------------------------------
    def _announce(self, descriptor: list[int]) -> tuple[Any, torch.Tensor, list[torch.Tensor]]:
        """Start gathering every rank's descriptor (a fixed size: gloo never sees mismatched buffers, which it
        answers by aborting the process)."""
        mine = torch.tensor(descriptor, dtype=torch.int64)
        everyone = [torch.empty_like(mine) for _ in range(self.size())]
        return self._meta.allgather([everyone], [mine]), mine, everyone

    def _check(self, mine: torch.Tensor, everyone: list[torch.Tensor]) -> None:
        if any(not torch.equal(other, mine) for other in everyone):
            ranks = "; ".join(f"rank {r}: {_describe(d.tolist())}" for r, d in enumerate(everyone))
            raise CollectiveMismatch(f"the ranks issued different collectives ({ranks}): a rank that took another "
                                     "path (a graph on one, eager on another) would hang or corrupt this step on the "
                                     "device")

    def _failure(self, name: str, exc: RuntimeError) -> RuntimeError:
        """The error of a failed collective; in an lmdeploy worker a divergence or a timeout ends the process."""
        error = RuntimeError(f"hccl {name} on {self.describe()} failed (a peer died, timed out after "
                             f"{self.timeout.total_seconds():g} s, or issued a different collective): {exc}")
        error.__cause__ = exc
        if isinstance(exc, CollectiveMismatch) or "timed out" in str(exc).lower():
            _tear_down_worker(error)
        return error

    # collectives ----------------------------------------------------------------------------------------------
    def allreduce(self, tensors: Any, opts: Any = None, *args: Any, **kwargs: Any) -> _Handle:
        from torch._C._distributed_c10d import AllreduceOptions, ReduceOp

        tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        op = opts.reduceOp if isinstance(opts, AllreduceOptions) else (ReduceOp.SUM if opts is None else opts)
        inner = _inner("all_reduce", tensors)

        def start() -> tuple[list[Any], Callable[[], None]]:
            staged = [_stage(t) for t in inner]
            options = AllreduceOptions()
            options.reduceOp = op
            work = self._gloo.allreduce(staged, options)

            def finish() -> None:
                for t, s in zip(inner, staged, strict=True):
                    t.copy_(s)

            return [work], finish

        return _issue(self, "all_reduce", start, _descriptor("all_reduce", inner), tensors)

    def allreduce_coalesced(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> _Handle:
        return self.allreduce(list(tensors), opts)

    def broadcast(self, tensors: Any, opts: Any = None, *args: Any, **kwargs: Any) -> _Handle:
        from torch._C._distributed_c10d import BroadcastOptions

        tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        root = opts.rootRank if isinstance(opts, BroadcastOptions) else int(opts or 0)
        inner = _inner("broadcast", tensors)

        def start() -> tuple[list[Any], Callable[[], None]]:
            staged = [_stage(t) for t in inner]
            options = BroadcastOptions()
            options.rootRank, options.rootTensor = root, 0
            work = self._gloo.broadcast(staged, options)

            def finish() -> None:
                for t, s in zip(inner, staged, strict=True):
                    t.copy_(s)

            return [work], finish

        return _issue(self, "broadcast", start, _descriptor("broadcast", inner, root), tensors)

    def allgather(self, output_lists: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],
                  opts: Any = None) -> _Handle:
        outs = [_inner("all_gather", outputs) for outputs in output_lists]
        ins = _inner("all_gather", inputs)

        def start() -> tuple[list[Any], Callable[[], None]]:
            staged_in = [_stage(t) for t in ins]
            staged_out = [[torch.empty(o.shape, dtype=o.dtype) for o in outputs] for outputs in outs]
            work = self._gloo.allgather(staged_out, staged_in)

            def finish() -> None:
                for outputs, staged in zip(outs, staged_out, strict=True):
                    for o, s in zip(outputs, staged, strict=True):
                        o.copy_(s)

            return [work], finish

        return _issue(self, "all_gather", start, _descriptor("all_gather", ins),
                      [t for outputs in output_lists for t in outputs])

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> _Handle:  # noqa: A002
        out, = _inner("all_gather_into_tensor", [output])
        inp, = _inner("all_gather_into_tensor", [input])
        if out.numel() != inp.numel() * self.size():
            raise RuntimeError(f"hccl all_gather_into_tensor: the output has {out.numel()} elements, not "
                               f"{self.size()} x {inp.numel()}")

        def start() -> tuple[list[Any], Callable[[], None]]:
            staged = _stage(inp)
            chunks = [torch.empty_like(staged) for _ in range(self.size())]
            work = self._gloo.allgather([chunks], [staged])

            def finish() -> None:
                out.copy_(torch.cat([c.reshape(-1) for c in chunks]).view(out.shape))

            return [work], finish

        return _issue(self, "all_gather_into_tensor", start, _descriptor("all_gather_into_tensor", [inp]), [output])

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
                                        opts: Any = None) -> _Handle:
        handles = [self.all_gather_single(output, input, opts)  # noqa: A001
                   for output, input in zip(outputs, inputs, strict=True)]
        return handles[-1] if handles else _Handle([], None, rt.current_stream())

    def _reduce_chunks(self, name: str, outputs: list[torch.Tensor], chunks: list[list[torch.Tensor]], op: Any,
                       result: list[torch.Tensor]) -> _Handle:
        """outputs[i] = the reduction over ranks of chunks[i][this rank] (one all-reduce of all chunks)."""
        from torch._C._distributed_c10d import AllreduceOptions

        me = self.rank()

        def start() -> tuple[list[Any], Callable[[], None]]:
            flat = torch.cat([c.reshape(-1) for row in chunks for c in row]).contiguous()
            options = AllreduceOptions()
            options.reduceOp = op
            work = self._gloo.allreduce([flat], options)

            def finish() -> None:
                offset = 0
                for out, row in zip(outputs, chunks, strict=True):
                    for rank, c in enumerate(row):
                        if rank == me:
                            out.copy_(flat[offset:offset + c.numel()].view(out.shape))
                        offset += c.numel()

            return [work], finish

        return _issue(self, name, start, _descriptor(name, [c for row in chunks for c in row]), result)

    def reduce_scatter(self, outputs: Sequence[torch.Tensor], input_lists: Sequence[Sequence[torch.Tensor]],
                       opts: Any = None) -> _Handle:
        from torch._C._distributed_c10d import ReduceOp

        op = getattr(opts, "reduceOp", ReduceOp.SUM)
        outs = _inner("reduce_scatter", outputs)
        rows = [_inner("reduce_scatter", row) for row in input_lists]
        for out, row in zip(outs, rows, strict=True):
            if len(row) != self.size() or out.numel() != row[self.rank()].numel():
                raise RuntimeError(f"hccl reduce_scatter: {len(row)} inputs for {self.size()} ranks, or an output "
                                   f"of {out.numel()} elements for this rank's {row[self.rank()].numel()}")
        return self._reduce_chunks("reduce_scatter", outs, rows, op, list(outputs))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> _Handle:  # noqa: A002
        from torch._C._distributed_c10d import ReduceOp

        op = getattr(opts, "reduceOp", ReduceOp.SUM)
        out, = _inner("reduce_scatter_tensor", [output])
        inp, = _inner("reduce_scatter_tensor", [input])
        if inp.numel() != out.numel() * self.size():
            raise RuntimeError(f"hccl reduce_scatter_tensor: the input has {inp.numel()} elements, not "
                               f"{self.size()} x {out.numel()}")
        return self._reduce_chunks("reduce_scatter_tensor", [out], [list(inp.reshape(self.size(), -1))], op,
                                   [output])

    _reduce_scatter_base = reduce_scatter_single

    def barrier(self, opts: Any = None) -> _Handle:
        """Waits for the device (every stream, this group's collectives included), then for every rank."""
        stream = rt.current_stream()
        rt._check_sync_allowed("barrier() of an hccl group (it waits for the device)", stream)
        rt.sync_device("barrier() of an hccl group")
        try:
            self._gloo.barrier().wait()
        except RuntimeError as exc:
            raise self._failure("barrier", exc) from exc
        return _Handle([], None, stream)

    def _unsupported(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the simulated hccl group runs all_reduce, broadcast, all_gather(_into_tensor), "
                                  "reduce_scatter(_tensor) and barrier; not this collective")

    reduce = gather = scatter = alltoall = alltoall_base = all_to_all_single = send = recv = _unsupported


__all__ = ["MAX_TIMEOUT", "NAME", "Collective", "CollectiveMismatch", "HcclProcessGroup", "register"]
