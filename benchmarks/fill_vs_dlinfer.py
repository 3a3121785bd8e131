"""Host time and device operations of one graph-buffer fill per decode step: the REAL dlinfer fill against
vendor_graph's, on identical plain CPU tensors, in one run.

dlinfer is the unmodified source snapshot named by ``VENDOR_GRAPH_DLINFER_SRC`` (default
``/work/shared/third_party/dlinfer``). Its vendor modules
``dlinfer/framework/lmdeploy_ext/cudagraph/{ascend,camb,maca}_cudagraph.py`` are imported from their files
(nothing is copied into this repository, no ``.pyc`` is written next to them) while the simulator's
``torch_npu`` is installed (``vendor_graph_sim.device.use_torch_npu``, the release
``vendor_graph_sim.realstack`` runs dlinfer on); ``MoeMetadata`` comes from dlinfer's
``dlinfer/utils/type_annotation.py`` the same way. Importing those modules assigns ``CudaGraphMixin``
methods: lmdeploy's ``CudaGraphMixin`` attributes are saved before and restored after, so nothing else in
the process sees dlinfer's patch.

Arms, alternating in blocks of ``block`` steps (gc off while timing, ``time.perf_counter_ns`` around the
call only; medians, min and p90 over ``reps`` steps per arm and point):

* ``dlinfer``: ``<Vendor>CudaGraphMixin_fill_buffers_cudagraph`` + ``..._update_context_cudagraph`` on
  buffers from its own ``..._make_buffers_cudagraph`` (an lmdeploy ``CudaGraphMeta``), with the step's
  ``StepContext`` current in lmdeploy's step-context manager (``get_step_ctx_manager()`` is what the Ascend
  fill reads ``moe_metadata`` from). ``moe_metadata`` is dlinfer's ``MoeMetadata`` with
  ``x_active_mask=None``: what lmdeploy's Ascend backend builds on a single rank (ep_size <= 1, no MC2).
* ``vendor_graph``: ``BufferSpec.fill`` + ``bind_context`` of the matching ``_common.specs()`` entry
  (ascend-0.17 and ascend-0.18 against dlinfer's Ascend fill, camb-0.17 against Camb, maca-0.17 against MACA).
  Where ``fill`` takes the step's ``StepContext`` (``fill(meta, inputs, attn, context)``), it is passed, as
  vendor_graph's own ``fill_buffers_cudagraph`` passes it; the results name the call (``vendor_graph``).
* ``floor``: one bare ``torch._foreach_copy_`` over exactly the (dst, src) pairs vendor_graph writes at that
  step of the schedule (captured once per step from an untimed pass of a separate vendor_graph state: every
  ``copy_`` / ``_foreach_copy_`` of its fill and bind, in one list): the cost of the copies alone.

Every arm gets the same prepared steps (``_common.decode_step`` plus ``is_decoding`` /
``is_multi_token_decoding``, which dlinfer's Ascend fill reads, and a ``moe_metadata``); each call gets
shallow copies, as both fills rebind attributes of what they are given. After every block the live rows of
both arms' ``block_offsets``, ``kv_seqlens``, ``kv_start_indices``, ``input_ids`` and ``position_ids`` are
checked against the step's sources.

Points: live batch 1, 8, 37 and 64 in a graph of 64 rows and 256 in a graph of 256, 24 block-table
columns live, ``NUM_BLOCKS`` columns in the graph; each steady (the same batch every step) and shrinking
(a larger batch with 28 columns, then the point's batch: padding rows and columns are reset every other
step). A full-batch point cannot shrink: its "shrinking" variant alternates 60/64 (256: 250/256), where
the smaller step resets rows and the full step resets the block-table columns; it is labelled so.

Device operations per call (one untimed call per step of the schedule, after timing), counted by a
``TorchDispatchMode``:

* not counted: view and alias ops (``OpOverload.is_view``: view, slice, select, narrow, as_strided, expand,
  alias, detach, ...) and allocations that launch no kernel (:data:`NO_KERNEL`); their names are listed in
  the results under ``ignored``;
* every other aten op counts once per call, and is classified by the tensors it writes (its schema's
  ``Tensor(a!)`` arguments; a functional op writes its fresh output): ``host`` if it writes a buffer that
  is host-placed on a real device, ``device`` if it writes a device buffer or a temporary. A foreach op
  writing both kinds counts once in each (on a device, vendor_graph issues those as two foreach calls).
  Host-placed: for vendor_graph, fields declared ``Placement.HOST``; for dlinfer, the buffers its
  ``make_buffers`` allocates without ``device=`` (found while it runs: a ``TorchFunctionMode`` marks
  every tensor made with ``device=`` or computed from one; Ascend's ``kv_seqlens`` and ``q_seqlens`` are
  not). On plain CPU every tensor is a CPU tensor, so the rule is by buffer, not by tensor device.

The goal (:data:`GOAL`): vendor_graph at least 2x faster than dlinfer at every point, by median. It is
reported, not asserted.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fill_vs_dlinfer.py [--reps 3000] [--block 200]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import hashlib
import importlib.util
import inspect
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
import torch  # noqa: E402, I001
from torch.overrides import TorchFunctionMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

GOAL = 2.0  # vendor_graph median at least GOAL times faster than dlinfer's, at every point
SEED = 0
REPS = 3000  # timed steps per arm and point
BLOCK = 200  # consecutive steps of one arm before switching
NUM_BLOCKS = 64  # block-table columns of every graph (graph_meta.num_blocks)
COLUMNS = 24  # live block-table columns of the point's own steps
LARGER_COLUMNS = 28  # live columns of the larger step of a shrinking schedule
VOCAB = 1000  # graph_meta.vocab_size (dlinfer's Ascend fill draws the padding token ids below it)
VARIANTS = 8  # distinct prepared steps per schedule entry (cycled)
ARMS = ("dlinfer", "vendor_graph", "floor")
DLINFER_ENV = "VENDOR_GRAPH_DLINFER_SRC"
DEFAULT_DLINFER = Path("/work/shared/third_party/dlinfer")
CUDAGRAPH_DIR = Path("dlinfer/framework/lmdeploy_ext/cudagraph")
# vendor_graph spec -> the dlinfer vendor module it replaces
DLINFER_VENDOR = {"ascend-0.17": "ascend", "ascend-0.18": "ascend", "camb-0.17": "camb", "maca-0.17": "maca"}
_PREFIX = {"ascend": "Ascend", "camb": "Camb", "maca": "Maca"}
# (graph rows, live batch, larger batch of the shrinking variant)
POINTS = ((64, 1, 8), (64, 8, 16), (64, 37, 45), (64, 64, 60), (256, 256, 250))
# Ops that allocate without launching a kernel: not device work.
NO_KERNEL = frozenset({"aten.empty.memory_format", "aten.empty_strided.default", "aten.new_empty.default",
                       "aten.new_empty_strided.default", "aten.empty_like.default", "aten.lift_fresh.default"})
# buffers compared against the step's sources after every block: name -> (source, rows dim, has columns)
LIVE_CHECKED = ("block_offsets", "kv_seqlens", "kv_start_indices", "input_ids", "position_ids")


class DlinferSourceMissing(RuntimeError):
    """No usable dlinfer source tree (the message says which path and what is missing)."""


# -- dlinfer ----------------------------------------------------------------------------------------------


def dlinfer_root() -> Path:
    """The dlinfer source tree: ``$VENDOR_GRAPH_DLINFER_SRC``, else :data:`DEFAULT_DLINFER`; raises
    :class:`DlinferSourceMissing` when it lacks the vendor fill modules."""
    given = os.environ.get(DLINFER_ENV)
    root = Path(given) if given else DEFAULT_DLINFER
    how = f"{DLINFER_ENV}={given}" if given else f"{DLINFER_ENV} unset, default {DEFAULT_DLINFER}"
    needed = [CUDAGRAPH_DIR / f"{v}_cudagraph.py" for v in _PREFIX] + [Path("dlinfer/utils/type_annotation.py")]
    missing = [str(p) for p in needed if not (root / p).is_file()]
    if missing:
        raise DlinferSourceMissing(
            f"no usable dlinfer source tree at {root} ({how}): missing {', '.join(missing)}. Set {DLINFER_ENV} "
            f"to an unmodified dlinfer checkout (the folder holding dlinfer/__init__.py)")
    return root


def _load_file(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their module while the class is made
    spec.loader.exec_module(module)
    return module


_LOADED: dict[str, Any] = {}


def load_dlinfer() -> SimpleNamespace:
    """dlinfer's Ascend, Camb and MACA cudagraph modules and ``MoeMetadata``, imported from the source files
    under the simulator's torch_npu, with lmdeploy's ``CudaGraphMixin`` restored afterwards (once per process)."""
    if "dlinfer" in _LOADED:
        return _LOADED["dlinfer"]
    root = dlinfer_root()
    from lmdeploy.pytorch.models.utils.cudagraph import CudaGraphMixin
    from vendor_graph_sim import device as sim
    from vendor_graph_sim.realstack import pinned_release

    from vendor_graph.vendors.ascend.releases import GENERATIONS

    release = pinned_release(GENERATIONS[-1])  # the torch_npu the real-stack runs dlinfer on
    saved = dict(vars(CudaGraphMixin))
    saved_bytecode = sys.dont_write_bytecode
    sys.dont_write_bytecode = True  # the snapshot stays untouched
    modules = {}
    try:
        with sim.use_torch_npu(release):
            for vendor in _PREFIX:
                modules[vendor] = _load_file(f"_fill_vs_dlinfer_{vendor}_cudagraph",
                                             root / CUDAGRAPH_DIR / f"{vendor}_cudagraph.py")
        annotations = _load_file("_fill_vs_dlinfer_type_annotation", root / "dlinfer/utils/type_annotation.py")
    finally:
        sys.dont_write_bytecode = saved_bytecode
        for key in [k for k in vars(CudaGraphMixin) if k not in saved]:
            delattr(CudaGraphMixin, key)
        for key, value in saved.items():
            if vars(CudaGraphMixin).get(key, None) is not value:
                setattr(CudaGraphMixin, key, value)
    files = [root / CUDAGRAPH_DIR / f"{v}_cudagraph.py" for v in _PREFIX]
    loaded = SimpleNamespace(
        root=root, modules=modules, MoeMetadata=annotations.MoeMetadata, torch_npu=release,
        sha256={str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files})
    _LOADED["dlinfer"] = loaded
    return loaded


def dlinfer_methods(vendor: str) -> tuple[Callable, Callable, Callable]:
    """(make_buffers, fill_buffers, update_context) of dlinfer's ``vendor`` module."""
    module, prefix = load_dlinfer().modules[vendor], _PREFIX[vendor]
    return tuple(getattr(module, f"{prefix}CudaGraphMixin_{what}_cudagraph")
                 for what in ("make_buffers", "fill_buffers", "update_context"))


def dlinfer_meta(graph: int) -> Any:
    from lmdeploy.pytorch.models.utils.cudagraph import CudaGraphMeta

    return CudaGraphMeta(max_batchs=graph, max_tokens=graph, num_blocks=NUM_BLOCKS, is_decoding=True,
                         device=torch.device("cpu"), input_buffers={}, output_buffers={}, vocab_size=VOCAB,
                         is_ssm=False, use_mrope=False)


class _ExplicitDevice(TorchFunctionMode):
    """Tensors made in the block with an explicit ``device=``, or computed from such tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.placed: dict[int, torch.Tensor] = {}  # id -> tensor (kept alive: ids stay unique)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if kwargs.get("device") is not None or any(id(t) in self.placed for t in inputs):
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.placed[id(t)] = t
        return out


def made_with_placement(make: Callable[[], dict[str, torch.Tensor]]) -> tuple[dict[str, torch.Tensor], frozenset[str]]:
    """``make()``'s buffers and the names of those made without ``device=`` (host-placed on a real device too):
    neither made with a ``device=`` nor computed from a tensor that was."""
    with _ExplicitDevice() as mode:
        made = make()
    return made, frozenset(k for k, t in made.items() if id(t) not in mode.placed)


# -- steps --------------------------------------------------------------------------------------------------


def prepare_step(name: str, batch: int, columns: int, seed: int) -> tuple[dict, Any, Any]:
    """``_common.decode_step`` plus what dlinfer's fill reads beyond it: ``is_decoding``,
    ``is_multi_token_decoding`` (lmdeploy 0.18's ``AscendAttentionMetadata`` has both) and ``moe_metadata``."""
    inputs, attn, ctx = _common.decode_step(name, batch, columns, seed=seed)
    attn.is_decoding = True
    attn.is_multi_token_decoding = False
    ctx.moe_metadata = load_dlinfer().MoeMetadata(x_active_mask=None)
    return inputs, attn, ctx


def fresh(step: tuple) -> tuple[dict, Any, Any]:
    """Shallow copies of a prepared step (both fills rebind attributes of what they are given; dlinfer's
    also ``moe_metadata.x_active_mask``)."""
    inputs, attn, ctx = step
    ctx = SimpleNamespace(**vars(ctx))
    if ctx.moe_metadata is not None:
        ctx.moe_metadata = dataclasses.replace(ctx.moe_metadata)
    return dict(inputs), SimpleNamespace(**vars(attn)), ctx


def _dlinfer_kwargs(inputs: dict, attn: Any) -> dict:
    """The kwargs lmdeploy's graph runner hands ``fill_buffers_cudagraph`` for a decode step."""
    return {"input_ids": inputs["input_ids"], "position_ids": inputs["position_ids"], "past_key_values": [],
            "attn_metadata": attn, "inputs_embeds": None}


def schedules(graph: int, batch: int, larger: int) -> list[tuple[str, str, list[tuple[int, int]]]]:
    """(schedule kind, description, [(live batch, columns) of consecutive steps]) for one point."""
    steady = ("steady", "steady", [(batch, COLUMNS)])
    if larger > batch:
        shrink = ("shrinking", f"after {larger} (resets every other step)",
                  [(larger, LARGER_COLUMNS), (batch, COLUMNS)])
    else:  # a full batch cannot shrink: alternate with a smaller one
        shrink = ("alternating", f"alternating with {larger} (full batch, the shrinking variant: the {larger}-step "
                  f"resets rows, the {batch}-step block-table columns)", [(larger, LARGER_COLUMNS), (batch, COLUMNS)])
    return [steady, shrink]


# -- arms ---------------------------------------------------------------------------------------------------


class _MetaBuffers:
    """An arm whose buffers are its ``meta.input_buffers``, ``host`` naming the host-placed ones."""

    meta: Any
    host: frozenset[str]

    @property
    def buffers(self) -> dict[str, torch.Tensor]:
        return self.meta.input_buffers

    def placement(self) -> dict[int, tuple[str, bool]]:
        return {t.untyped_storage().data_ptr(): (k, k in self.host) for k, t in self.buffers.items()}


class DlinferArm(_MetaBuffers):
    def __init__(self, vendor: str, graph: int, capture: tuple) -> None:
        self.make, self.fill_fn, self.update_fn = dlinfer_methods(vendor)
        from lmdeploy.pytorch.model_inputs import StepContextManager

        self.ctx_mgr = StepContextManager()
        self.meta = dlinfer_meta(graph)
        inputs, attn, ctx = fresh(capture)
        self.meta.input_buffers, self.host = made_with_placement(
            lambda: self.make(None, self.meta, **_dlinfer_kwargs(inputs, attn)))
        self.run(capture)  # the capture step's fill + update, as dlinfer's AscendSingleGraphRunner.capture

    def time_block(self, steps: list, positions: Iterable[int], out: list[int]) -> None:
        from lmdeploy.pytorch.model_inputs import set_step_ctx_manager

        perf, fill, update, meta, mgr = time.perf_counter_ns, self.fill_fn, self.update_fn, self.meta, self.ctx_mgr
        set_step_ctx_manager(mgr)
        try:
            for p in positions:
                inputs, attn, ctx = fresh(steps[p])
                kwargs = _dlinfer_kwargs(inputs, attn)
                mgr.set_context(ctx)
                t0 = perf()
                fill(None, meta, **kwargs)
                update(None, meta, ctx)
                out.append(perf() - t0)
        finally:
            set_step_ctx_manager(None)
            mgr.set_context(None)

    def run(self, step: tuple, around: Any = None) -> None:
        from lmdeploy.pytorch.model_inputs import step_ctx_manager

        inputs, attn, ctx = fresh(step)
        kwargs = _dlinfer_kwargs(inputs, attn)
        with step_ctx_manager(self.ctx_mgr), self.ctx_mgr.context(ctx), around or contextlib.nullcontext():
            self.fill_fn(None, self.meta, **kwargs)
            self.update_fn(None, self.meta, ctx)


def fill_takes_context(spec: Any) -> bool:
    """Whether ``BufferSpec.fill`` takes the step's ``StepContext`` (then vendor_graph's own
    ``fill_buffers_cudagraph`` passes it, and ``bind_context`` only binds what fill already wrote)."""
    return "context" in inspect.signature(type(spec).fill).parameters


class VendorGraphArm(_MetaBuffers):
    def __init__(self, spec: Any, graph: int, capture: tuple) -> None:
        from vendor_graph.buffers import Placement

        self.spec = spec
        self.with_context = fill_takes_context(spec)
        self.meta = _common.graph_meta(graph, NUM_BLOCKS)
        inputs, attn, ctx = fresh(capture)
        self.meta.input_buffers = spec.make(self.meta, inputs, attn)
        self._call(inputs, attn, ctx)
        self.host = frozenset(f.name for f in spec.fields if f.placement is Placement.HOST)

    def _call(self, inputs: dict, attn: Any, ctx: Any) -> None:
        if self.with_context:
            self.spec.fill(self.meta, inputs, attn, ctx)
        else:
            self.spec.fill(self.meta, inputs, attn)
        self.spec.bind_context(self.meta, ctx)

    def time_block(self, steps: list, positions: Iterable[int], out: list[int]) -> None:
        perf, fill, bind, meta = time.perf_counter_ns, self.spec.fill, self.spec.bind_context, self.meta
        if self.with_context:
            for p in positions:
                inputs, attn, ctx = fresh(steps[p])
                t0 = perf()
                fill(meta, inputs, attn, ctx)
                bind(meta, ctx)
                out.append(perf() - t0)
        else:
            for p in positions:
                inputs, attn, ctx = fresh(steps[p])
                t0 = perf()
                fill(meta, inputs, attn)
                bind(meta, ctx)
                out.append(perf() - t0)

    def run(self, step: tuple, around: Any = None) -> None:
        inputs, attn, ctx = fresh(step)
        with around or contextlib.nullcontext():
            self._call(inputs, attn, ctx)


class FloorArm:
    """One ``_foreach_copy_`` per step over the pairs a vendor_graph fill + bind writes at that step."""

    def __init__(self, spec: Any, graph: int, capture: tuple, steps: list) -> None:
        self.vg = VendorGraphArm(spec, graph, capture)
        for step in steps:  # warm-up: every (extent, high water) plan of the cycle exists
            self.vg.run(step)
        self.pairs = []
        for step in steps:  # the cycle again, from the state the timed loop starts in (after its last step)
            dsts: list[torch.Tensor] = []
            srcs: list[torch.Tensor] = []
            self.vg.run(step, around=_CopySpy(dsts, srcs))
            if not dsts:
                raise RuntimeError("vendor_graph's fill copied nothing: no floor to take")
            self.pairs.append((dsts, srcs))

    @property
    def buffers(self) -> dict[str, torch.Tensor]:
        return self.vg.buffers

    def placement(self) -> dict[int, tuple[str, bool]]:
        return self.vg.placement()

    def time_block(self, steps: list, positions: Iterable[int], out: list[int]) -> None:
        perf, pairs, copy = time.perf_counter_ns, self.pairs, torch._foreach_copy_
        for p in positions:
            dsts, srcs = pairs[p]
            t0 = perf()
            copy(dsts, srcs)
            out.append(perf() - t0)

    def run(self, step: tuple, around: Any = None, position: int = 0) -> None:
        dsts, srcs = self.pairs[position]
        with around or contextlib.nullcontext():
            torch._foreach_copy_(dsts, srcs)


class _CopySpy(TorchDispatchMode):
    """Records the (dst, src) pairs of every ``copy_`` / ``_foreach_copy_`` in the block (and still runs
    them); any other op writing a tensor is refused, as the floor could not stand for it."""

    def __init__(self, dsts: list, srcs: list) -> None:
        super().__init__()
        self.dsts, self.srcs = dsts, srcs

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._foreach_copy_.default:
            self.dsts.extend(args[0])
            self.srcs.extend(args[1])
        elif func is torch.ops.aten.copy_.default:
            self.dsts.append(args[0])
            self.srcs.append(args[1])
        elif any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments):
            raise RuntimeError(f"vendor_graph's fill wrote with {func}: the floor covers copies only")
        return func(*args, **kwargs)


# -- device operations --------------------------------------------------------------------------------------


class OpCounter(TorchDispatchMode):
    """Counts the non-view aten ops of a block, classified by the buffers they write (module docstring)."""

    def __init__(self, placement: dict[int, tuple[str, bool]]) -> None:
        super().__init__()
        self.placement = placement
        self.device = 0
        self.host = 0
        self.calls = 0
        self.by_op: Counter[str] = Counter()
        self.ignored: Counter[str] = Counter()
        self.written: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        if func.is_view or name in NO_KERNEL:
            self.ignored[name] += 1
            return func(*args, **kwargs)
        written = []
        for i, arg in enumerate(func._schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                value = kwargs[arg.name] if arg.name in kwargs else (args[i] if i < len(args) else None)
                written.extend(value if isinstance(value, (list, tuple)) else [value])
        kinds = set()
        for t in written:
            if isinstance(t, torch.Tensor):
                buffer, host = self.placement.get(t.untyped_storage().data_ptr(), (None, False))
                kinds.add("host" if host else "device")
                self.written[buffer or "(temporary)"] += 1
        if not kinds:  # a functional op: its output is a fresh temporary, made where its inputs are
            kinds.add("device")
            self.written["(temporary)"] += 1
        self.calls += 1
        self.device += "device" in kinds
        self.host += "host" in kinds
        self.by_op[name] += 1
        return func(*args, **kwargs)

    def summary(self) -> dict[str, Any]:
        return {"device": self.device, "host": self.host, "calls": self.calls, "by_op": dict(self.by_op),
                "written": dict(self.written), "ignored": dict(self.ignored)}


def count_ops(arm: Any, steps: list, positions: Sequence[int], period: int) -> list[dict[str, Any]]:
    """The ops of one call per position (continuing the arm's schedule); ``index``: the position's step of
    the schedule (``period`` steps long)."""
    out = []
    for p in positions:
        counter = OpCounter(arm.placement())
        if isinstance(arm, FloorArm):
            arm.run(steps[p], around=counter, position=p)
        else:
            arm.run(steps[p], around=counter)
        batch, columns = steps[p][1].block_offsets.shape
        out.append({"index": p % period, "step": [batch, columns], **counter.summary()})
    return out


# -- checks -------------------------------------------------------------------------------------------------


def live_regions(buffers: dict[str, torch.Tensor], batch: int, columns: int) -> dict[str, torch.Tensor]:
    """The live part of the checked buffers, as int64 (dtypes differ between the arms)."""
    out = {}
    for name in LIVE_CHECKED:
        t = buffers.get(name)
        if t is None:
            continue
        if name == "block_offsets":
            t = t[:batch, :columns]
        elif name in ("input_ids", "position_ids"):
            t = t[:, :batch]
        else:
            t = t[:batch]
        out[name] = t.to(torch.int64).reshape(-1)
    return out


def source_regions(step: tuple) -> dict[str, torch.Tensor]:
    inputs, attn, _ = step
    return {"block_offsets": attn.block_offsets, "kv_seqlens": attn.kv_seqlens,
            "kv_start_indices": attn.kv_start_indices, "input_ids": inputs["input_ids"],
            "position_ids": inputs["position_ids"]}


def check_live(arms: dict[str, Any], step: tuple, where: str) -> None:
    """Both arms' live rows equal the step's sources (raises AssertionError)."""
    batch, columns = step[1].block_offsets.shape
    sources = {k: v.to(torch.int64).reshape(-1) for k, v in source_regions(step).items()}
    for arm in ("dlinfer", "vendor_graph"):
        live = live_regions(arms[arm].buffers, batch, columns)
        missing = [k for k in ("block_offsets", "kv_seqlens", "kv_start_indices") if k not in live]
        if missing:
            raise AssertionError(f"{where}: {arm} has no buffer {missing}")
        for key, value in live.items():
            if not torch.equal(value, sources[key]):
                raise AssertionError(f"{where}: {arm}'s {key} does not hold the step's live data")


# -- one point ----------------------------------------------------------------------------------------------


def _stats(t: list[int]) -> dict[str, float]:
    s = sorted(t)
    return {"median_us": statistics.median(s) / 1e3, "min_us": s[0] / 1e3, "p90_us": s[int(0.9 * len(s))] / 1e3,
            "reps": len(s)}


def run_point(name: str, spec: Any, graph: int, schedule: list[tuple[int, int]], reps: int, block: int,
              inspect: bool = False) -> dict[str, Any]:
    vendor = DLINFER_VENDOR[name]
    capture = prepare_step(name, *schedule[0], seed=SEED)
    steps = [prepare_step(name, *schedule[i % len(schedule)], seed=SEED + 1 + i)
             for i in range(VARIANTS * len(schedule))]
    arms = {"dlinfer": DlinferArm(vendor, graph, capture), "vendor_graph": VendorGraphArm(spec, graph, capture),
            "floor": FloorArm(spec, graph, capture, steps)}
    for arm in ("dlinfer", "vendor_graph"):  # warm-up: the floor's state already went round the cycle twice
        for step in steps:
            arms[arm].run(step)
    times: dict[str, list[int]] = {arm: [] for arm in ARMS}
    n, cursor = len(steps), 0
    gc.collect()
    gc.disable()
    try:
        while len(times["vendor_graph"]) < reps:
            count = min(block, reps - len(times["vendor_graph"]))
            positions = [(cursor + i) % n for i in range(count)]
            for arm in ARMS:
                arms[arm].time_block(steps, positions, times[arm])
            cursor += count
            check_live(arms, steps[(cursor - 1) % n], f"{name} {schedule}")
    finally:
        gc.enable()
    # one call per step of the schedule, continuing its order; listed in the schedule's order
    ops = {arm: sorted(count_ops(arms[arm], steps, [(cursor + i) % n for i in range(len(schedule))], len(schedule)),
                       key=lambda o: o.pop("index")) for arm in ARMS}
    result = {arm: _stats(times[arm]) for arm in ARMS}
    out = {"dlinfer_us": result["dlinfer"]["median_us"], "vendor_graph_us": result["vendor_graph"]["median_us"],
           "floor_us": result["floor"]["median_us"],
           "vs_dlinfer_fill": result["dlinfer"]["median_us"] / result["vendor_graph"]["median_us"],
           "vs_dlinfer_fill_min": result["dlinfer"]["min_us"] / result["vendor_graph"]["min_us"]}
    out["goal_met"] = out["vs_dlinfer_fill"] >= GOAL
    out["timing"] = result
    out["ops"] = ops
    out["host_buffers"] = {"dlinfer": sorted(arms["dlinfer"].host), "vendor_graph": sorted(arms["vendor_graph"].host)}
    if inspect:  # the live rows of the last counted step, for the test
        last = steps[(cursor + len(schedule) - 1) % n]
        batch, columns = last[1].block_offsets.shape
        out["inspect"] = {"step": [batch, columns],
                          "source": {k: v.tolist() for k, v in source_regions(last).items()},
                          **{arm: {k: v.tolist() for k, v in live_regions(arms[arm].buffers, batch, columns).items()}
                             for arm in ("dlinfer", "vendor_graph")}}
    return out


def compare(reps: int = REPS, block: int = BLOCK, specs: Sequence[str] | None = None,
            points: Sequence[tuple[int, int, int]] | None = None, kinds: Sequence[str] | None = None,
            inspect: bool = False, progress: Callable[[dict], None] | None = None) -> list[dict[str, Any]]:
    """Every (spec, point, schedule): one dict each with ``dlinfer_us``, ``vendor_graph_us``, ``floor_us``
    (medians), ``vs_dlinfer_fill`` (dlinfer median / vendor_graph median), ``goal_met``, ``timing`` (median,
    min, p90 per arm), ``ops`` (per arm, one call per step of the schedule). ``specs`` / ``points``
    (``(graph, batch, larger)`` of :data:`POINTS`) / ``kinds`` (``steady``, ``shrinking``, ``alternating``)
    narrow the run; ``inspect`` adds the last step's live rows of both arms and of the sources."""
    all_specs = _common.specs()
    results = []
    for name in specs or DLINFER_VENDOR:
        for graph, batch, larger in points or POINTS:
            for kind, description, schedule in schedules(graph, batch, larger):
                if kinds is not None and kind not in kinds:
                    continue
                r = {"spec": name, "dlinfer": DLINFER_VENDOR[name], "graph_batch": graph, "live_batch": batch,
                     "schedule": kind, "description": description,
                     "label": f"{batch} of {graph}, {description}", "steps": [list(s) for s in schedule]}
                r |= run_point(name, all_specs[name], graph, schedule, reps, block, inspect=inspect)
                results.append(r)
                if progress is not None:
                    progress(r)
    return results


# -- report -------------------------------------------------------------------------------------------------


def _ops_cell(ops: list[dict], key: str) -> str:
    return " · ".join(str(o[key]) for o in ops)


def table(results: list[dict]) -> list[str]:
    rows = [
        f"| spec (dlinfer) | live batch of graph | schedule | dlinfer µs median (min / p90) | vendor_graph µs median "
        f"(min / p90) | floor µs median | **vs dlinfer fill** (by min) | goal {GOAL:g}x | device ops dlinfer / "
        f"vendor_graph | host ops dlinfer / vendor_graph |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        d, v, f = (r["timing"][a] for a in ARMS)
        rows.append(
            f"| {r['spec']} ({r['dlinfer']}) | {r['live_batch']} of {r['graph_batch']} | {r['description']}"
            f" | {d['median_us']:.1f} ({d['min_us']:.1f} / {d['p90_us']:.1f}) | {v['median_us']:.1f} "
            f"({v['min_us']:.1f} / {v['p90_us']:.1f}) | {f['median_us']:.1f} | **{r['vs_dlinfer_fill']:.2f}x** "
            f"({r['vs_dlinfer_fill_min']:.2f}x) | "
            f"{'yes' if r['goal_met'] else '**no**'} | {_ops_cell(r['ops']['dlinfer'], 'device')} / "
            f"{_ops_cell(r['ops']['vendor_graph'], 'device')} | {_ops_cell(r['ops']['dlinfer'], 'host')} / "
            f"{_ops_cell(r['ops']['vendor_graph'], 'host')} |")
    met = sum(r["goal_met"] for r in results)
    worst = min(results, key=lambda r: r["vs_dlinfer_fill"])
    rows += ["", f"Goal (vendor_graph >= {GOAL:g}x faster than dlinfer by median, at every point): "
             f"{'met' if met == len(results) else 'NOT met'}; reached at {met} of {len(results)} points, lowest "
             f"{worst['vs_dlinfer_fill']:.2f}x ({worst['spec']}, {worst['label']}).",
             "", "Ops per call, one value per step of the schedule (larger step first where it alternates); "
             "a foreach writing device and host buffers counts in both columns. Rules: "
             "benchmarks/fill_vs_dlinfer.py docstring."]
    return rows


def vendor_graph_provenance() -> dict[str, Any]:
    """Which vendor_graph was measured: its folder, the repository's HEAD and uncommitted files under it,
    the call the arm makes, and a hash of the ``vendor_graph/buffers/`` sources."""
    import vendor_graph
    import vendor_graph.buffers as buffers

    package = Path(vendor_graph.__file__).resolve().parent
    out: dict[str, Any] = {"path": str(package),
                           "buffers_py_sha256": hashlib.sha256(b"".join(
                               p.read_bytes() for p in sorted(Path(buffers.__file__).parent.glob("*.py")))).hexdigest(),
                           "call": "fill(meta, inputs, attn, context) + bind_context(meta, context)"
                           if fill_takes_context(next(iter(_common.specs().values())))
                           else "fill(meta, inputs, attn) + bind_context(meta, context)"}
    if package.parent == _common.ROOT:
        def git(*args: str) -> str:
            return subprocess.run(["git", "-C", str(_common.ROOT), *args], capture_output=True, text=True,
                                  check=False).stdout

        out["git_head"] = git("rev-parse", "HEAD").strip()
        out["uncommitted"] = [line[3:] for line in git("status", "--porcelain", "--", "vendor_graph").splitlines()
                              if line.strip()]
    else:
        out["git_head"] = None  # not this repository's working tree
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=REPS, help="timed steps per arm and point")
    parser.add_argument("--block", type=int, default=BLOCK, help="consecutive steps per arm before switching")
    args = parser.parse_args(argv)
    try:
        loaded = load_dlinfer()
    except DlinferSourceMissing as exc:
        print(f"fill_vs_dlinfer: {exc}", file=sys.stderr)
        return 2
    started, load_before = time.perf_counter(), os.getloadavg()

    def progress(r: dict) -> None:
        print(f"{r['spec']:12s} {r['label'][:60]:60s} dlinfer {r['dlinfer_us']:6.1f}  vendor_graph "
              f"{r['vendor_graph_us']:5.1f}  floor {r['floor_us']:5.1f} us  {r['vs_dlinfer_fill']:5.2f}x", flush=True)

    results = compare(args.reps, args.block, progress=progress)
    elapsed = time.perf_counter() - started
    payload = {"benchmark": "fill_vs_dlinfer",
               "what": "host time and device ops of one graph-buffer fill + context update per decode step: the "
                       "real dlinfer fill vs vendor_graph's BufferSpec.fill + bind_context, plain CPU tensors",
               "goal": {"vs_dlinfer_fill_at_least": GOAL, "by": "median", "met": all(r["goal_met"] for r in results),
                        "met_points": sum(r["goal_met"] for r in results), "points": len(results)},
               "args": vars(args) | {"seed": SEED, "num_blocks": NUM_BLOCKS, "columns": COLUMNS,
                                     "larger_columns": LARGER_COLUMNS, "vocab_size": VOCAB, "variants": VARIANTS},
               "dlinfer": {"source": str(loaded.root), "sha256": loaded.sha256,
                           "imported_under_simulated_torch_npu": loaded.torch_npu,
                           "moe_metadata": "dlinfer MoeMetadata(x_active_mask=None): single rank, no MC2"},
               "vendor_graph": vendor_graph_provenance(), "environment": _common.environment(),
               "elapsed_s": round(elapsed, 1),
               "load_average_1_5_15": {"before": list(load_before), "after": list(os.getloadavg())},
               "results": results}
    rows = table(results)
    json_path, md_path = _common.write_results("fill_vs_dlinfer", payload, rows)
    print("\n".join(rows))
    print(f"{len(results)} points in {elapsed:.0f} s; wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
