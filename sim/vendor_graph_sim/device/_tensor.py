"""``SimTensor``: a tensor of the simulated device, a wrapper over a real CPU tensor.

Every aten or custom op that reaches ``SimTensor.__torch_dispatch__`` is classified once per overload
(:class:`OpInfo`) and handled by one of a few handlers:

- views run at once (they write no data) and alias the base's storage;
- composite-implicit ops are decomposed (under ``inference_mode`` they arrive undecomposed);
- metadata-only aten ops (no tensor result, nothing written) run at once;
- ops that need the host to read device data (``.item()``, data-dependent shapes such as ``nonzero``,
  boolean-mask indexing) drain the current stream first, and fail during capture;
- copies between host and device follow the runtime's copy rules (see :func:`copy_between`);
- everything else is device work: run at once when the current stream is idle and ``eager_drain`` is
  on, otherwise queued with outputs pre-allocated from meta shapes, or recorded into the capturing
  graph (outputs from the graph's pool, poisoned until the first replay).

Host values are frozen when an op is queued or recorded: Python lists are copied, host tensors cloned,
except the source of a ``non_blocking`` host-to-device copy (and the destination of a ``non_blocking``
device-to-host copy), which is read (written) when the copy runs, as DMA from pinned memory is.
"""

from __future__ import annotations

from typing import Any

import torch

from . import _runtime as rt
from ._runtime import Block, OpNode, SimCaptureError, counters

aten = torch.ops.aten
_CPU = torch.device("cpu")
_META = torch.device("meta")
_DEVICE = torch.device("privateuseone", 0)  # replaced by set_device_type() at install
_DEVICE_TYPE = "npu"
_state = rt.state()
_config = rt.config


def set_device_type(device_type: str) -> None:
    global _DEVICE, _DEVICE_TYPE
    _DEVICE_TYPE = device_type
    _DEVICE = torch.device(device_type, 0)


class SimTensor(torch.Tensor):
    """A device tensor (``npu:0``) whose data lives in the CPU tensor ``_inner``.

    ``_alloc`` is the graph-pool block the data lives in (None outside graph pools); views share it.
    """

    _inner: torch.Tensor
    _alloc: Block | None

    @staticmethod
    def __new__(cls, inner: torch.Tensor, alloc: Block | None = None) -> SimTensor:
        self = torch.Tensor._make_wrapper_subclass(
            cls, inner.size(), strides=inner.stride(), storage_offset=inner.storage_offset(), dtype=inner.dtype,
            device=_DEVICE, requires_grad=False)
        self._inner = inner
        self._alloc = alloc
        return self

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        info = _INFO.get(func)
        if info is None:
            info = _op_info(func)
        return info.handler(func, info, args, kwargs or {})

    # host reads -------------------------------------------------------------------------------
    def tolist(self) -> Any:
        rt.sync_current(".tolist() of a device tensor")
        counters.d2h += 1
        counters.device_ops += 1
        counters.by_op["d2h"] += 1
        return self._inner.tolist()

    def data_ptr(self) -> int:
        return self._inner.data_ptr()

    def record_stream(self, stream: Any) -> None:
        return None

    def numpy(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"can't convert {_DEVICE} device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                        "to host memory first.")

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        stream = _state.current
        if stream.capture is not None or _state.captures:
            return f"SimTensor(<unreadable during graph capture>, size={tuple(self.shape)}, dtype={self.dtype})"
        rt.drain_all()
        return f"SimTensor({self._inner!r}, device='{_DEVICE}')"

    def __reduce_ex__(self, proto: int) -> Any:
        raise TypeError("SimTensor cannot be pickled; use .cpu() first")


def wrap(inner: torch.Tensor, alloc: Block | None = None) -> SimTensor:
    return SimTensor(inner, alloc)


def is_device_tensor(x: Any) -> bool:
    return isinstance(x, SimTensor)


# --------------------------------------------------------------------------------------------------
# argument mapping


def _device_mix_error(name: str) -> RuntimeError:
    return RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                        f"{_DEVICE} and cpu! (when checking argument for {name})")


def _unwrap_slow(x: Any, strict: bool, name: str, freeze: bool) -> Any:
    if isinstance(x, SimTensor):
        return x._inner
    if isinstance(x, torch.Tensor):
        if strict and x.dim() > 0:
            raise _device_mix_error(name)
        return x.clone() if freeze else x
    t = type(x)
    if t is list or t is tuple:
        out = []
        for item in x:
            ti = type(item)
            if ti is SimTensor:
                out.append(item._inner)
            elif ti is int or ti is float or item is None:
                out.append(item)
            else:
                out.append(_unwrap_slow(item, strict, name, freeze))
        return out
    if t is torch.device and x.type == _DEVICE_TYPE:
        return _CPU
    return x


def unwrap_args(args: Any, strict: bool, name: str, freeze: bool = False) -> list[Any]:
    out = []
    for a in args:
        t = type(a)
        if t is SimTensor:
            out.append(a._inner)
        elif t is int or t is float or t is bool or a is None:
            out.append(a)
        else:
            out.append(_unwrap_slow(a, strict, name, freeze))
    return out


def unwrap_kwargs(kwargs: dict[str, Any], strict: bool, name: str, freeze: bool = False) -> dict[str, Any]:
    if not kwargs:
        return {}
    out = {}
    for k, a in kwargs.items():
        t = type(a)
        if t is SimTensor:
            out[k] = a._inner
        elif t is int or t is float or t is bool or a is None:
            out[k] = a
        else:
            out[k] = _unwrap_slow(a, strict, name, freeze)
    return out


def _meta_of(x: Any) -> Any:
    if isinstance(x, SimTensor):
        i = x._inner
        return torch.empty_strided(i.size(), i.stride(), dtype=i.dtype, device=_META)
    t = type(x)
    if t is list or t is tuple:
        return [_meta_of(i) for i in x]
    if t is torch.device and x.type == _DEVICE_TYPE:
        return _META
    return x


def _zeros_of(x: Any) -> Any:
    if isinstance(x, SimTensor):
        return torch.zeros_like(x._inner)
    t = type(x)
    if t is list or t is tuple:
        return [_zeros_of(i) for i in x]
    if t is torch.device and x.type == _DEVICE_TYPE:
        return _CPU
    return x


def _result_shapes(func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """The op's outputs without running it on real data: meta kernels, else a dry run on zeros."""
    try:
        return func(*[_meta_of(a) for a in args], **{k: _meta_of(v) for k, v in kwargs.items()})
    except Exception:
        guard = torch._C._InferenceMode(True)
        try:
            return func(*[_zeros_of(a) for a in args], **{k: _zeros_of(v) for k, v in kwargs.items()})
        finally:
            del guard


# --------------------------------------------------------------------------------------------------
# op classification


class OpInfo:
    """How one op overload is handled; built once per overload."""

    __slots__ = ("name", "handler", "strict", "rets", "single", "fresh")

    def __init__(self, func: Any) -> None:
        schema = func._schema
        self.name: str = func.__name__
        self.strict = func.namespace == "aten" and func not in _HOST_OK
        written: dict[str, tuple[int, str]] = {}
        for pos, arg in enumerate(schema.arguments):
            alias = arg.alias_info
            if alias is not None and alias.is_write:
                # ``Tensor(a!)[]`` (the ``_foreach_*_`` ops) carries its alias set on the list's elements:
                # the argument's own set is empty, but the op still writes its tensors.
                for alias_set in alias.before_set or {f"<{arg.name}>"}:
                    written[alias_set] = (10**6 if arg.kwarg_only else pos, arg.name)
        rets: list[tuple] = []
        for ret in schema.returns:
            alias = ret.alias_info
            kind = str(ret.type)
            if alias is not None and alias.is_write:
                source = next((written[s] for s in alias.before_set if s in written), None)
                rets.append(("alias", *source) if source is not None else ("other",))
            elif kind in ("Tensor", "Tensor?"):
                rets.append(("T",))
            elif kind in ("Tensor[]", "Tensor?[]", "List[Tensor]", "List[Optional[Tensor]]"):
                rets.append(("L",))
            else:
                rets.append(("other",))
        self.rets = rets
        self.fresh = any(r[0] in ("T", "L") for r in rets)
        if not rets:
            self.single = 3
        elif len(rets) == 1 and rets[0][0] == "T":
            self.single = 1
        elif len(rets) == 1 and rets[0][0] == "alias" and rets[0][1] == 0:
            self.single = 2
        else:
            self.single = 0
        self.handler = _handler_for(func, self, written)


_INFO: dict[Any, OpInfo] = {}


def _op_info(func: Any) -> OpInfo:
    info = OpInfo(func)
    _INFO[func] = info
    return info


_SYNC_NAMES = frozenset({
    "nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive",
    "unique_dim_consecutive", "equal", "is_nonzero", "allclose", "bincount", "_local_scalar_dense",
    "nonzero_numpy", "argwhere", "_assert_async",
})
_UNSUPPORTED = frozenset({
    "set_", "resize_", "resize_as_", "as_strided_", "t_", "transpose_", "squeeze_", "unsqueeze_", "swapdims_",
    "swapaxes_", "_resize_output_",
})


def _handler_for(func: Any, info: OpInfo, written: dict) -> Any:
    special = _SPECIAL.get(func)
    if special is not None:
        return special
    base = info.name.split(".", 1)[0]
    aten_op = func.namespace == "aten"
    if aten_op and base in _SYNC_NAMES:
        return _h_sync
    if aten_op and base in _UNSUPPORTED:
        return _h_unsupported
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
        return _h_decompose
    if func.is_view:
        return _h_view
    if aten_op and not written and not info.fresh:
        return _h_meta
    return _h_device


# --------------------------------------------------------------------------------------------------
# results


def _resolve_alias(entry: tuple, args: Any, kwargs: dict[str, Any]) -> Any:
    pos, name = entry[1], entry[2]
    return args[pos] if pos < len(args) else kwargs.get(name)


def _wrap_now(out: Any, info: OpInfo, args: Any, kwargs: dict[str, Any]) -> Any:
    """Wrap the result of an op that ran at once."""
    single = info.single
    if single == 1:
        return SimTensor(out)
    if single == 2:
        return args[0]
    if single == 3:
        return out
    rets = info.rets
    values = (out,) if len(rets) == 1 else out
    result = []
    for entry, value in zip(rets, values, strict=False):
        kind = entry[0]
        if kind == "alias":
            result.append(_resolve_alias(entry, args, kwargs))
        elif kind == "T":
            result.append(None if value is None else SimTensor(value))
        elif kind == "L":
            result.append([None if t is None else SimTensor(t) for t in value])
        else:
            result.append(value)
    return result[0] if len(rets) == 1 else tuple(result)


def _wrap_later(info: OpInfo, shapes: Any, args: Any, kwargs: dict[str, Any], pool: rt.Pool | None,
                override: list | None = None) -> tuple[Any, list | None]:
    """Pre-allocate the outputs of a queued or recorded op. Returns (result for the caller, buffers)."""
    rets = info.rets
    if not info.fresh and override is None:
        if info.single == 2:
            return args[0], None
        if info.single == 3:
            return None, None
    values = (shapes,) if len(rets) == 1 else (shapes if shapes is not None else [None] * len(rets))
    result: list[Any] = []
    outs: list[Any] = []
    supply = iter(override) if override is not None else None

    def fresh(meta: Any) -> Any:
        if meta is None:
            outs.append(None)
            return None
        if supply is not None:
            inner = next(supply)
            outs.append(inner)
            return None if inner is None else SimTensor(inner)
        inner, block = rt.allocate(meta.size(), meta.stride(), meta.dtype, pool)
        outs.append(inner)
        return SimTensor(inner, block)

    for entry, value in zip(rets, values, strict=False):
        kind = entry[0]
        if kind == "alias":
            target = _resolve_alias(entry, args, kwargs)
            outs.extend([None] * (len(target) if isinstance(target, (list, tuple)) else 1))
            result.append(target)
        elif kind == "T":
            result.append(fresh(value))
        elif kind == "L":
            result.append([fresh(m) for m in value])
        else:
            outs.append(None)
            result.append(value)
    if not any(o is not None for o in outs):
        outs_or_none = None
    else:
        outs_or_none = outs
    return (result[0] if len(rets) == 1 else tuple(result)), outs_or_none


def make_node(func: Any, info: OpInfo, args: Any, kwargs: dict[str, Any], pool: rt.Pool | None,
              override: list | None = None) -> tuple[OpNode, Any]:
    """Freeze an op into a node with pre-allocated outputs (for a queue, a graph or a task update)."""
    shapes = _result_shapes(func, args, kwargs) if (info.fresh and override is None) else None
    result, outs = _wrap_later(info, shapes, args, kwargs, pool, override)
    node = OpNode(func, unwrap_args(args, info.strict, info.name, True),
                  unwrap_kwargs(kwargs, info.strict, info.name, True), outs, info.name)
    return node, result


def _record(func: Any, info: OpInfo, args: Any, kwargs: dict[str, Any], stream: rt.Stream) -> Any:
    capture = stream.capture
    if capture is not None:
        if capture.invalid is not None:
            raise SimCaptureError(f"the capture was invalidated by an earlier error: {capture.invalid}")
        node, result = make_node(func, info, args, kwargs, capture.graph.pool)
        capture.add(node)
        return result
    scope = stream.update
    counters.device_ops += 1
    counters.by_op["task_update:" + info.name] += 1
    node, result = make_node(func, info, args, kwargs, None, scope.outs)
    scope.nodes.append(node)
    return result


# --------------------------------------------------------------------------------------------------
# handlers


def _h_device(func: Any, info: OpInfo, args: Any, kwargs: dict[str, Any]) -> Any:
    stream = _state.current
    if stream.capture is None and stream.update is None:
        counters.device_ops += 1
        counters.by_op[info.name] += 1
        if not stream.queue and _config.eager_drain:
            out = func(*unwrap_args(args, info.strict, info.name), **unwrap_kwargs(kwargs, info.strict, info.name))
            return _wrap_now(out, info, args, kwargs)
        node, result = make_node(func, info, args, kwargs, None)
        rt.enqueue(stream, rt._Deferred(node))
        return result
    return _record(func, info, args, kwargs, stream)


def _h_view(func: Any, info: OpInfo, args: Any, kwargs: dict[str, Any]) -> Any:
    out = func(*unwrap_args(args, False, info.name), **unwrap_kwargs(kwargs, False, info.name))
    base = args[0]
    alloc = base._alloc if isinstance(base, SimTensor) else None
    if torch.is_inference_mode_enabled() and isinstance(base, torch.Tensor) and not base.is_inference():
        # a view of a normal tensor is a normal tensor, even under inference_mode
        guard = torch._C._InferenceMode(False)
        try:
            return _wrap_view(out, alloc)
        finally:
            del guard
    return _wrap_view(out, alloc)


def _wrap_view(out: Any, alloc: Block | None) -> Any:
    if isinstance(out, torch.Tensor):
        return SimTensor(out, alloc)
    return type(out)(SimTensor(o, alloc) for o in out)


def _h_decompose(func: Any, info: OpInfo, args: Any, kwargs: dict[str, Any]) -> Any:
    out = func.decompose(*args, **kwargs)
    if out is NotImplemented:
        return _h_device(func, info, args, kwargs)
    return out


def _h_meta(func: Any, info: OpInfo, args: Any, kwargs: dict[str, Any]) -> Any:
    return func(*unwrap_args(args, False, info.name), **unwrap_kwargs(kwargs, False, info.name))


def _h_sync(func: Any, info: OpInfo, args: Any, kwargs: dict[str, Any]) -> Any:
    rt.sync_current(f"{info.name} (its result depends on device data: a device-to-host sync)")
    counters.device_ops += 1
    counters.by_op[info.name] += 1
    counters.d2h += 1
    out = func(*unwrap_args(args, info.strict, info.name), **unwrap_kwargs(kwargs, info.strict, info.name))
    return _wrap_now(out, info, args, kwargs)


def _h_unsupported(func: Any, info: OpInfo, args: Any, kwargs: dict[str, Any]) -> Any:
    if info.name.startswith("resize_") and isinstance(args[0], SimTensor) and len(args) > 1 \
            and tuple(args[1]) == tuple(args[0].shape):
        return args[0]
    raise NotImplementedError(f"the simulator cannot change a device tensor's metadata in place ({info.name}); "
                              "use the out-of-place op")


def _h_item(func: Any, info: OpInfo, args: Any, kwargs: dict[str, Any]) -> Any:
    rt.sync_current(".item() / bool() / int() of a device tensor")
    counters.d2h += 1
    counters.device_ops += 1
    counters.by_op["d2h"] += 1
    return func(args[0]._inner)


def _h_to_copy(func: Any, info: OpInfo, args: Any, kwargs: dict[str, Any]) -> Any:
    device = kwargs.get("device")
    if device is not None and torch.device(device).type == "cpu":
        non_blocking = bool(kwargs.get("non_blocking", False))
        rt.sync_current(".cpu() / .to('cpu') of a device tensor")
        counters.d2h += 1
        counters.device_ops += 1
        counters.by_op["d2h"] += 1
        kw = dict(kwargs)
        kw["non_blocking"] = False
        del non_blocking
        return func(args[0]._inner, **kw)
    return _h_device(func, info, args, kwargs)


def _has_bool_index(indices: Any) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())


def _h_index(func: Any, info: OpInfo, args: Any, kwargs: dict[str, Any]) -> Any:
    indices = args[1] if len(args) > 1 else kwargs.get("indices")
    if _has_bool_index(indices):
        return _h_sync(func, info, args, kwargs)
    return _h_device(func, info, args, kwargs)


def _h_copy(func: Any, info: OpInfo, args: Any, kwargs: dict[str, Any]) -> Any:
    non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
    return copy_between(args[0], args[1], bool(non_blocking), func, info, args, kwargs)


def copy_between(dst: torch.Tensor, src: Any, non_blocking: bool, func: Any = None, info: OpInfo | None = None,
                 args: Any = None, kwargs: dict[str, Any] | None = None) -> torch.Tensor:
    """``dst.copy_(src)`` with at least one side on the device.

    Host-to-device: a blocking copy waits for the stream (illegal in capture); a ``non_blocking`` one is
    queued or recorded and reads the host tensor when it runs. Device-to-host likewise.
    """
    dst_dev = isinstance(dst, SimTensor)
    src_dev = isinstance(src, SimTensor)
    if dst_dev and src_dev:
        if func is None:
            func, args, kwargs = aten.copy_.default, (dst, src, non_blocking), {}
            info = _INFO.get(func) or _op_info(func)
        return _h_device(func, info, args, kwargs or {})
    stream = _state.current
    if dst_dev:
        counters.h2d += 1
        name, node = "copy_.h2d", OpNode(aten.copy_.default, (dst._inner, src), {}, None, "copy_(host->device)")
    else:
        counters.d2h += 1
        name, node = "copy_.d2h", OpNode(aten.copy_.default, (dst, src._inner), {}, None, "copy_(device->host)")
    if stream.capture is not None or stream.update is not None:
        if not non_blocking:
            direction = "host-to-device" if dst_dev else "device-to-host"
            rt._check_sync_allowed(f"a blocking {direction} copy_", stream)
        if stream.capture is not None:
            stream.capture.add(node)
        else:
            stream.update.nodes.append(node)
        return dst
    counters.device_ops += 1
    counters.by_op[name] += 1
    if not non_blocking and not dst_dev:
        rt.sync_current("a blocking device-to-host copy_")
    _issue_copy(stream, node, non_blocking, "copy_")
    return dst


def _issue_copy(stream: Any, node: OpNode, non_blocking: bool, what: str) -> None:
    """Run a copy now if its stream is idle (eager drain), else queue it; a blocking copy waits for it."""
    if not stream.queue and _config.eager_drain:
        node.run()
        return
    rt.enqueue(stream, rt._Deferred(node))
    if not non_blocking:
        rt.sync_current(f"a blocking {what}")


def _h_foreach_copy(func: Any, info: OpInfo, args: Any, kwargs: dict[str, Any]) -> Any:
    """``torch._foreach_copy_(dsts, srcs, non_blocking)``: one device op when every pair is on the device.

    Pairs that cross between host and device are transfers of their own on any real runtime (CUDA's
    foreach falls back to one ``copy_`` per pair for them): each is counted as one more op and follows
    :func:`copy_between`'s rules (a blocking transfer waits for the stream and is illegal in capture; a
    ``non_blocking`` host source is read when the copy runs).
    """
    dsts = list(args[0])
    srcs = list(args[1] if len(args) > 1 else kwargs["src"])
    non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
    if len(dsts) != len(srcs):
        raise RuntimeError(f"_foreach_copy_: {len(dsts)} destinations but {len(srcs)} sources")
    crossing = [isinstance(d, SimTensor) != isinstance(s, SimTensor) for d, s in zip(dsts, srcs, strict=True)]
    if not any(crossing):
        return _h_device(func, info, args, kwargs)
    h2d = sum(1 for d, c in zip(dsts, crossing, strict=True) if c and isinstance(d, SimTensor))
    d2h = sum(crossing) - h2d
    inner_dsts = [d._inner if isinstance(d, SimTensor) else d for d in dsts]
    inner_srcs = [s._inner if isinstance(s, SimTensor) else s for s in srcs]
    node = OpNode(func, (inner_dsts, inner_srcs, non_blocking), {}, None, "_foreach_copy_(host<->device)")
    stream = _state.current
    if stream.capture is not None or stream.update is not None:
        if not non_blocking:
            rt._check_sync_allowed("a blocking host<->device _foreach_copy_", stream)
        if stream.capture is not None:
            stream.capture.add(node)
        else:
            stream.update.nodes.append(node)
        return None
    ops = sum(crossing) + (1 if not all(crossing) else 0)
    counters.h2d += h2d
    counters.d2h += d2h
    counters.device_ops += ops
    if not all(crossing):
        counters.by_op[info.name] += 1
    if h2d:
        counters.by_op["_foreach_copy_.h2d"] += h2d
    if d2h:
        counters.by_op["_foreach_copy_.d2h"] += d2h
    if not non_blocking and d2h:
        rt.sync_current("a blocking device-to-host _foreach_copy_")
    _issue_copy(stream, node, non_blocking, "_foreach_copy_")
    return None


def _h_copy_from_kernel(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    return copy_between(dst, src, non_blocking)


_HOST_OK = frozenset({
    aten.copy_.default, aten._to_copy.default, aten.index.Tensor, aten.index_put_.default, aten.index_put.default,
    aten._index_put_impl_.default, aten._copy_from.default,
})
def _h_allocation(func: Any, info: OpInfo, args: Any, kwargs: dict[str, Any]) -> Any:
    """An uninitialised tensor like another (``new_empty``, ``empty_like``): an allocation, as the factories'
    ``empty`` is (:func:`adopt_factory`), never a device operation."""
    out = func(*unwrap_args(args, info.strict, info.name), **unwrap_kwargs(kwargs, info.strict, info.name))
    return adopt_factory(out, True, info.name)


_SPECIAL: dict[Any, Any] = {
    aten.new_empty.default: _h_allocation,
    aten.new_empty_strided.default: _h_allocation,
    aten.empty_like.default: _h_allocation,
    aten.copy_.default: _h_copy,
    aten._foreach_copy_.default: _h_foreach_copy,
    aten._to_copy.default: _h_to_copy,
    aten._local_scalar_dense.default: _h_item,
    aten.index.Tensor: _h_index,
    aten.index_put_.default: _h_index,
    aten.index_put.default: _h_index,
    aten._index_put_impl_.default: _h_index,
}


# --------------------------------------------------------------------------------------------------
# factories (the PrivateUse1 kernels of aten factory ops)


def adopt_factory(value: torch.Tensor, allocation_only: bool, name: str) -> SimTensor:
    """Turn a factory's CPU result into a device tensor, as the device would have produced it."""
    stream = _state.current
    capture = stream.capture
    if capture is not None:
        inner, block = rt.allocate(value.size(), value.stride(), value.dtype, capture.graph.pool)
        if not allocation_only:
            capture.add(OpNode(aten.copy_.default, (inner, value), {}, None, name))
        return SimTensor(inner, block)
    if allocation_only:
        return SimTensor(rt.poison_(value))
    counters.device_ops += 1
    counters.by_op[name] += 1
    if not stream.queue and _config.eager_drain:
        return SimTensor(value)
    inner, _ = rt.allocate(value.size(), value.stride(), value.dtype, None)
    rt.enqueue(stream, rt._Deferred(OpNode(aten.copy_.default, (inner, value), {}, None, name)))
    return SimTensor(inner)
