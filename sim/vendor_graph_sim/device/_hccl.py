"""``hccl``: the simulated NPU's process-group backend, HCCL's collectives over gloo on loopback.

lmdeploy on Ascend asks torch.distributed for ``hccl`` (``AscendOpsBackend.ccl_backend()``) in ``new_group`` for
its device groups, beside CPU ``gloo`` groups of its own; its tensor-parallel workers join the default group asking
for ``nccl`` (their device context is not Ascend yet there), which transfer_to_npu, the real one and the
simulator's, turns into ``hccl``. :func:`register` (run by :func:`vendor_graph_sim.device.install`) registers the name
for the simulated device; each group is a :class:`HcclProcessGroup`, which runs every collective on the
simulated device's tensors by staging their contents on the host (a contiguous copy), running gloo on the
copies and copying the result back.

Collectives are device work, in stream order like every other op of the simulator:

* outside a capture a collective runs at once, after the work already queued on the current stream (with
  ``config.eager_drain = False`` that work runs first; a stream held at a wait that nothing will satisfy
  raises :class:`~._runtime.SimDeadlockError` instead of hanging);
* during a capture nothing runs: the collective is recorded into the graph as one task over the tensors it
  was given (static addresses), and every replay runs it again on their contents at that point of the
  replay. Replaying the same graph on every rank therefore issues the same collectives in the same order,
  as replaying an HCCL graph does. ``barrier()`` waits for the device, so it cannot be captured.

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


class _Done(torch.distributed.Work if torch.distributed.is_available() else object):  # type: ignore[misc]
    """The work handle of a collective that already ran (or was recorded into the capturing graph)."""

    def __init__(self, result: list[torch.Tensor]) -> None:
        super().__init__()
        self._result = result

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> Any:
        return None

    def synchronize(self) -> None:
        return None

    def result(self) -> list[torch.Tensor]:
        return self._result

    def get_future(self) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(self._result)
        return future


def _tear_down_worker(error: RuntimeError) -> None:
    """In a worker lmdeploy spawned under vendor_graph: leave ``error`` for the parent and end the process."""
    from vendor_graph import settings, workers

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


def _issue(group: HcclProcessGroup, name: str, run: Callable[[], None], descriptor: list[int]) -> None:
    """Issue the collective ``run`` on the current stream: recorded when it captures, else run at once after the
    stream's queued work. Each run first agrees ``descriptor`` with the other ranks."""
    stream = rt.current_stream()
    label = f"hccl.{name}"
    if stream.update is not None:
        raise RuntimeError(f"hccl {name} inside graph_task_update_begin/end: a task update cannot re-issue a "
                           "collective")

    def guarded() -> None:
        try:
            group._agree(descriptor)
            run()
        except RuntimeError as exc:
            error = RuntimeError(f"hccl {name} on {group.describe()} failed (a peer died, timed out after "
                                 f"{group.timeout.total_seconds():g} s, or issued a different collective): {exc}")
            error.__cause__ = exc
            if isinstance(exc, CollectiveMismatch) or "timed out" in str(exc).lower():
                _tear_down_worker(error)
            raise error from exc

    task = rt.CallTask(guarded, label)
    if stream.capture is not None:
        stream.capture.add(task)  # each replay runs it again, on the tensors' contents at that point
        return
    rt.counters.device_ops += 1
    rt.counters.by_op[label] += 1
    if not stream.queue:
        task.run()
        return
    ran: list[bool] = []
    rt.enqueue(stream, rt.CallTask(lambda: (guarded(), ran.append(True)), label))
    rt._drain_until(lambda: bool(ran), f"hccl {name} (it reads what the stream's queued work writes)", stream)


class HcclProcessGroup(torch.distributed.ProcessGroup if torch.distributed.is_available() else object):  # type: ignore[misc]
    """One ``hccl`` group: its collectives on simulated device tensors, run by a gloo group of the same ranks."""

    def __init__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta) -> None:
        import torch.distributed as dist
        from torch._C._distributed_c10d import ProcessGroupGloo

        super().__init__(rank, size)
        self.timeout = min(timeout, MAX_TIMEOUT)
        options = ProcessGroupGloo._Options()
        options._devices = [ProcessGroupGloo.create_device(hostname=LOOPBACK)]
        options._timeout = self.timeout
        self._gloo = ProcessGroupGloo(dist.PrefixStore("sim-hccl/", store), rank, size, options)

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
        shutdown = getattr(self._gloo, "shutdown", None)
        if shutdown is not None:
            shutdown()

    abort = shutdown

    def _agree(self, descriptor: list[int]) -> None:
        """Gather every rank's descriptor (a fixed size: gloo never sees mismatched buffers, which it answers by
        aborting the process); a rank that issued another collective or other sizes fails this one on every rank."""
        mine = torch.tensor(descriptor, dtype=torch.int64)
        everyone = [torch.empty_like(mine) for _ in range(self.size())]
        self._gloo.allgather([everyone], [mine]).wait()
        if any(not torch.equal(other, mine) for other in everyone):
            ranks = "; ".join(f"rank {r}: {_describe(d.tolist())}" for r, d in enumerate(everyone))
            raise CollectiveMismatch(f"the ranks issued different collectives ({ranks}): a rank that took another "
                                     "path (a graph on one, eager on another) would hang or corrupt this step on the "
                                     "device")

    # collectives ----------------------------------------------------------------------------------------------
    def allreduce(self, tensors: Any, opts: Any = None, *args: Any, **kwargs: Any) -> _Done:
        from torch._C._distributed_c10d import AllreduceOptions, ReduceOp

        tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        op = opts.reduceOp if isinstance(opts, AllreduceOptions) else (ReduceOp.SUM if opts is None else opts)
        inner = _inner("all_reduce", tensors)

        def run() -> None:
            staged = [_stage(t) for t in inner]
            options = AllreduceOptions()
            options.reduceOp = op
            self._gloo.allreduce(staged, options).wait()
            for t, s in zip(inner, staged, strict=True):
                t.copy_(s)

        _issue(self, "all_reduce", run, _descriptor("all_reduce", inner))
        return _Done(tensors)

    def allreduce_coalesced(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> _Done:
        return self.allreduce(list(tensors), opts)

    def broadcast(self, tensors: Any, opts: Any = None, *args: Any, **kwargs: Any) -> _Done:
        from torch._C._distributed_c10d import BroadcastOptions

        tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        root = opts.rootRank if isinstance(opts, BroadcastOptions) else int(opts or 0)
        inner = _inner("broadcast", tensors)

        def run() -> None:
            staged = [_stage(t) for t in inner]
            options = BroadcastOptions()
            options.rootRank, options.rootTensor = root, 0
            self._gloo.broadcast(staged, options).wait()
            for t, s in zip(inner, staged, strict=True):
                t.copy_(s)

        _issue(self, "broadcast", run, _descriptor("broadcast", inner, root))
        return _Done(tensors)

    def allgather(self, output_lists: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],
                  opts: Any = None) -> _Done:
        outs = [_inner("all_gather", outputs) for outputs in output_lists]
        ins = _inner("all_gather", inputs)

        def run() -> None:
            staged_in = [_stage(t) for t in ins]
            staged_out = [[torch.empty(o.shape, dtype=o.dtype) for o in outputs] for outputs in outs]
            self._gloo.allgather(staged_out, staged_in).wait()
            for outputs, staged in zip(outs, staged_out, strict=True):
                for o, s in zip(outputs, staged, strict=True):
                    o.copy_(s)

        _issue(self, "all_gather", run, _descriptor("all_gather", ins))
        return _Done([t for outputs in output_lists for t in outputs])

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> _Done:  # noqa: A002
        out, = _inner("all_gather_into_tensor", [output])
        inp, = _inner("all_gather_into_tensor", [input])
        if out.numel() != inp.numel() * self.size():
            raise RuntimeError(f"hccl all_gather_into_tensor: the output has {out.numel()} elements, not "
                               f"{self.size()} x {inp.numel()}")

        def run() -> None:
            staged = _stage(inp)
            chunks = [torch.empty_like(staged) for _ in range(self.size())]
            self._gloo.allgather([chunks], [staged]).wait()
            out.copy_(torch.cat([c.reshape(-1) for c in chunks]).view(out.shape))

        _issue(self, "all_gather_into_tensor", run, _descriptor("all_gather_into_tensor", [inp]))
        return _Done([output])

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
                                        opts: Any = None) -> _Done:
        for output, input in zip(outputs, inputs, strict=True):  # noqa: A001
            self.all_gather_single(output, input, opts)
        return _Done(list(outputs))

    def _reduce_chunks(self, name: str, outputs: list[torch.Tensor], chunks: list[list[torch.Tensor]], op: Any
                       ) -> None:
        """outputs[i] = the reduction over ranks of chunks[i][this rank] (one all-reduce of all chunks)."""
        from torch._C._distributed_c10d import AllreduceOptions

        me = self.rank()

        def run() -> None:
            flat = torch.cat([c.reshape(-1) for row in chunks for c in row]).contiguous()
            options = AllreduceOptions()
            options.reduceOp = op
            self._gloo.allreduce([flat], options).wait()
            offset = 0
            for out, row in zip(outputs, chunks, strict=True):
                for rank, c in enumerate(row):
                    if rank == me:
                        out.copy_(flat[offset:offset + c.numel()].view(out.shape))
                    offset += c.numel()

        _issue(self, name, run, _descriptor(name, [c for row in chunks for c in row]))

    def reduce_scatter(self, outputs: Sequence[torch.Tensor], input_lists: Sequence[Sequence[torch.Tensor]],
                       opts: Any = None) -> _Done:
        from torch._C._distributed_c10d import ReduceOp

        op = getattr(opts, "reduceOp", ReduceOp.SUM)
        outs = _inner("reduce_scatter", outputs)
        rows = [_inner("reduce_scatter", row) for row in input_lists]
        for out, row in zip(outs, rows, strict=True):
            if len(row) != self.size() or out.numel() != row[self.rank()].numel():
                raise RuntimeError(f"hccl reduce_scatter: {len(row)} inputs for {self.size()} ranks, or an output "
                                   f"of {out.numel()} elements for this rank's {row[self.rank()].numel()}")
        self._reduce_chunks("reduce_scatter", outs, rows, op)
        return _Done(list(outputs))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> _Done:  # noqa: A002
        from torch._C._distributed_c10d import ReduceOp

        op = getattr(opts, "reduceOp", ReduceOp.SUM)
        out, = _inner("reduce_scatter_tensor", [output])
        inp, = _inner("reduce_scatter_tensor", [input])
        if inp.numel() != out.numel() * self.size():
            raise RuntimeError(f"hccl reduce_scatter_tensor: the input has {inp.numel()} elements, not "
                               f"{self.size()} x {out.numel()}")
        self._reduce_chunks("reduce_scatter_tensor", [out], [list(inp.reshape(self.size(), -1))], op)
        return _Done([output])

    _reduce_scatter_base = reduce_scatter_single

    def barrier(self, opts: Any = None) -> _Done:
        stream = rt.current_stream()
        rt._check_sync_allowed("barrier() of an hccl group (it waits for the device)", stream)
        rt.sync_device("barrier() of an hccl group")
        try:
            self._gloo.barrier().wait()
        except RuntimeError as exc:
            raise RuntimeError(f"hccl barrier on {self.describe()} failed (a peer died or timed out after "
                               f"{self.timeout.total_seconds():g} s): {exc}") from exc
        return _Done([])

    def _unsupported(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the simulated hccl group runs all_reduce, broadcast, all_gather(_into_tensor), "
                                  "reduce_scatter(_tensor) and barrier; not this collective")

    reduce = gather = scatter = alltoall = alltoall_base = all_to_all_single = send = recv = _unsupported


__all__ = ["MAX_TIMEOUT", "NAME", "CollectiveMismatch", "HcclProcessGroup", "register"]
