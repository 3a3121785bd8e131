"""Bridges over calls that lmdeploy and dlinfer spell differently, so that lmdeploy's engine runs on the dlinfer
stack at all (eager or graph mode). The gaps, and where each bridge patches: ``docs/upstream.md`` (Bridges).

A bridge is installed where, and only where, its signature check finds the gap: a call in lmdeploy's source does
not bind to the installed dlinfer function and does bind to the form the bridge adapts; no version string is read.
``VENDOR_GRAPH_BRIDGES``: ``auto``, ``off``, or the names allowed. Imports neither torch nor lmdeploy.
"""

from __future__ import annotations

import ast
import functools
import inspect
import logging
import sys
import textwrap
import types
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from ..config import settings
from . import patching

logger = logging.getLogger("vendor_graph")

BRIDGES_ENV = settings.variable("bridges")
CACHE_ENGINE_MODULE = "lmdeploy.pytorch.engine.cache_engine"
KERNELS_PACKAGE = "lmdeploy.pytorch.kernels.dlinfer"
DLINFER_OPS = "dlinfer.ops"
DLINFER_EXT_PREFIX = "dlinfer.framework.lmdeploy_ext"


@dataclass(frozen=True)
class Bridge:
    """One entry of the catalogue: its name (for ``VENDOR_GRAPH_BRIDGES``), what it fixes, the upstream pair."""

    name: str
    fixes: str
    upstream: str


STATE_CACHE = Bridge(
    "state-cache",
    "lmdeploy's StateCacheEngine passes allocate_caches state_specs= and num_layers=, which dlinfer's replacement "
    "allocate_caches(num_caches, state_shapes, device) does not take (TypeError building the cache engine)",
    "lmdeploy 0.16/0.17 pytorch/engine/cache_engine.py StateCacheEngine -> dlinfer main (a50184e) "
    "framework/lmdeploy_ext/device patch_state_cache_engine (Ascend)",
)
PREFILL_ATTENTION = Bridge(
    "prefill-attention",
    "lmdeploy's dlinfer prefill kernels call dlinfer.ops.prefill_attention with actual_seq_lengths_cpu= and no "
    "q_start_loc, and paged_prefill_attention without q_start_loc and cu_seq_lens_kv, which dlinfer's ops do not "
    "take (TypeError at every prefill)",
    "lmdeploy 0.18 pytorch/kernels/dlinfer (pagedattention.py, flash_attention.py) -> dlinfer main (a50184e) "
    "dlinfer/ops/llm.py",
)
BRIDGES: tuple[Bridge, ...] = (STATE_CACHE, PREFILL_ATTENTION)
NAMES: tuple[str, ...] = tuple(b.name for b in BRIDGES)


@dataclass(frozen=True)
class Applied:
    """A bridge installed in this process: its name, what it fixes, and the attribute it replaced."""

    name: str
    description: str
    target: str


_records: list[tuple[patching.Patch, Applied]] = []


def applied(activation: patching.Activation | None = None) -> tuple[Applied, ...]:
    """The bridges installed in this process (one entry per patched target), for ``doctor`` and the demo: those of
    ``activation`` (default: the active vendor's)."""
    activation = activation or patching.active()
    if activation is None:
        return ()
    live = {id(p) for p in activation.patches}
    return tuple(record for patch, record in _records if id(patch) in live)


def allowed(name: str, choice: str | tuple[str, ...] | None = None) -> bool:
    """Whether ``VENDOR_GRAPH_BRIDGES`` (``choice``, default the current settings) lets bridge ``name`` install."""
    choice = settings.current().bridges if choice is None else choice
    if choice == "auto":
        return True
    if choice == "off":
        return False
    return name in choice


def install(activation: patching.Activation) -> None:
    """Arm every bridge ``VENDOR_GRAPH_BRIDGES`` allows: each checks its signatures when the modules involved have
    been imported (now, if they are) and patches only where they disagree. Every change is a Patch on
    ``activation``, so ``vendor_graph.uninstall()`` restores what was there."""
    for bridge, watch in ((STATE_CACHE, _watch_state_cache), (PREFILL_ATTENTION, _watch_prefill)):
        if allowed(bridge.name):
            watch(activation)
        else:
            logger.debug("vendor_graph: bridge %s is off (%s)", bridge.name, BRIDGES_ENV)


# -- call forms ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallForm:
    """One call written in a caller's source: how many arguments it passes by position, which by keyword."""

    where: str
    positional: int
    keywords: tuple[str, ...]
    function: str | None = None  # the function whose body makes the call (the innermost), None at module level

    def fits(self, signature: inspect.Signature) -> bool:
        try:
            signature.bind(*range(self.positional), **dict.fromkeys(self.keywords))
        except TypeError:
            return False
        return True

    def __str__(self) -> str:
        args = [f"#{i}" for i in range(self.positional)] + [f"{k}=" for k in self.keywords]
        return f"({', '.join(args)}) at {self.where}"


def call_forms(source_of: Any, attribute: str, receivers: Collection[str] | None = None) -> list[CallForm] | None:
    """Every call ``<receiver>.<attribute>(...)`` in the source of ``source_of`` (a module, class or function),
    ``receiver`` any name or one of ``receivers``; None when the source cannot be read. Calls that unpack
    ``*args`` / ``**kwargs`` are left out: their form is not written down."""
    try:
        lines, start = inspect.getsourcelines(source_of)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError):
        return None
    module = getattr(source_of, "__module__", None) or getattr(source_of, "__name__", "?")
    enclosing: dict[int, str] = {}
    for function in ast.walk(tree):  # outer functions first, so an inner one's name wins for its own body
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            enclosing.update((id(inner), function.name) for inner in ast.walk(function) if inner is not function)
    forms = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == attribute):
            continue
        receiver = node.func.value
        if receivers is not None and not (isinstance(receiver, ast.Name) and receiver.id in receivers):
            continue
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            continue
        line = node.lineno + max(start - 1, 0)
        forms.append(CallForm(f"{module}:{line}", len(node.args), tuple(k.arg for k in node.keywords),
                              enclosing.get(id(node))))
    return forms


def _signature(func: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):
        return None


def _required(signature: inspect.Signature) -> set[str]:
    return {p.name for p in signature.parameters.values()
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def _needed(bridge: Bridge, callee_name: str, forms: list[CallForm] | None, callee: inspect.Signature | None,
            adapted: inspect.Signature, supplies: Collection[str]) -> bool:
    """Whether ``bridge`` must adapt the calls ``forms`` to ``callee``: some call does not fit ``callee``, every
    call that does not fit has the form the bridge adapts (``adapted``), and ``callee`` takes what it supplies."""
    if forms is None:
        logger.warning("vendor_graph: bridge %s cannot read the source of lmdeploy's calls to %s; it stands aside",
                       bridge.name, callee_name)
        return False
    if callee is None:
        logger.debug("vendor_graph: bridge %s: %s has no readable signature; stands aside", bridge.name, callee_name)
        return False
    misfits = [f for f in forms if not f.fits(callee)]
    if not misfits:
        logger.debug("vendor_graph: bridge %s not needed: %s takes lmdeploy's calls %s", bridge.name, callee_name,
                     ", ".join(map(str, forms)) or "(none)")
        return False
    unknown = [f for f in misfits if not f.fits(adapted)]
    positional_only = [p.name for p in callee.parameters.values() if p.kind is p.POSITIONAL_ONLY]
    missing = sorted(_required(callee) - set(supplies))
    if unknown or positional_only or missing:
        why = (f"lmdeploy's call {unknown[0]} is not the form the bridge adapts" if unknown else
               f"it takes {', '.join(positional_only or missing)}, which the bridge cannot supply by name")
        logger.warning("vendor_graph: lmdeploy's calls to %s%s do not fit it and bridge %s cannot adapt them (%s); "
                       "they will raise TypeError", callee_name, callee, bridge.name, why)
        return False
    return True


def _bridged(activation: patching.Activation, owner: Any, name: str) -> bool:
    return any(p.owner is owner and p.name == name for p in activation.patches)


def _apply(activation: patching.Activation, bridge: Bridge, patch: patching.Patch) -> None:
    activation.add(patch)
    record = Applied(bridge.name, bridge.fixes, patch.target)
    live = {id(p) for p in activation.patches}
    _records[:] = [(p, r) for p, r in _records if id(p) in live]
    _records.append((patch, record))
    logger.info("vendor_graph: bridge %s on %s: %s", bridge.name, patch.target, bridge.fixes)


# -- state-cache ---------------------------------------------------------------------------------------------


class StateSpecsNotSupported(RuntimeError):
    """lmdeploy asks for state caches that dlinfer's ``allocate_caches`` cannot lay out."""


def _lmdeploy_allocate_form(num_caches, state_shapes, device, state_specs=None, num_layers=None):
    """The call lmdeploy 0.16/0.17's ``StateCacheEngine`` makes (its own ``allocate_caches`` signature)."""


_STATE_CACHE_TAKES = ("num_caches", "state_shapes", "device")


def _field_default(cls: Any, name: str) -> Any:
    fields = getattr(cls, "__dataclass_fields__", {})
    return getattr(fields.get(name), "default", None)


def _unhonoured(spec: Any, alignment: Any) -> str | None:
    if getattr(spec, "layer_ids", None) is not None:
        return (f"layer_ids {list(spec.layer_ids)}: a layer-scoped cache, which lmdeploy lays out as (layers, caches, "
                f"...) while dlinfer allocates (caches, ...) and zeroes slots along its first axis")
    if alignment is not None and getattr(spec, "alignment", alignment) != alignment:
        return f"alignment {spec.alignment}: dlinfer allocates each state on its own and sizes it at {alignment}"
    return None


def _state_shapes(specs: list[Any], alignment: Any, installed: Any) -> list[tuple[tuple[int, ...], Any]]:
    refused = [f"{getattr(s, 'name', s)} ({why})" for s in specs if (why := _unhonoured(s, alignment))]
    if refused:
        raise StateSpecsNotSupported(
            f"lmdeploy asks StateCacheEngine.allocate_caches for state caches that "
            f"{patching.describe(installed)} (dlinfer's, which takes (shape, dtype) pairs only) cannot lay out: "
            f"{'; '.join(refused)}. vendor_graph's {STATE_CACHE.name} bridge passes each spec's shape and dtype on "
            f"and refuses the rest rather than allocating another layout. Fix: a dlinfer whose allocate_caches takes "
            f"state_specs, or lmdeploy 0.18, whose StateCacheEngine allocates these caches itself")
    return [(tuple(s.shape), s.dtype) for s in specs]


def state_cache_allocate(installed: Callable[..., Any], alignment: Any = None) -> Callable[..., Any]:
    """``installed`` (dlinfer's ``allocate_caches(num_caches, state_shapes, device)``) taking lmdeploy's call.

    lmdeploy's state specs, where given, replace ``state_shapes`` (as in lmdeploy's own allocation); each becomes
    the (shape, dtype) pair dlinfer allocates, in order, so lmdeploy's names (kept by ``StateCacheEngine`` from the
    same specs) match the caches returned. A spec that pair cannot express (layer-scoped, or an alignment other
    than ``alignment``) raises :class:`StateSpecsNotSupported`. ``num_layers`` only places layer-scoped caches."""

    def allocate_caches(num_caches, state_shapes, device, state_specs=None, num_layers=None):
        if state_specs:
            state_shapes = _state_shapes(list(state_specs), alignment, installed)
        return installed(num_caches=num_caches, state_shapes=state_shapes, device=device)

    allocate_caches.__qualname__ = f"allocate_caches ({STATE_CACHE.name} bridge over {patching.describe(installed)})"
    allocate_caches.__doc__ = state_cache_allocate.__doc__
    return allocate_caches


def _check_state_cache(activation: patching.Activation, _module: Any = None) -> None:
    module = sys.modules.get(CACHE_ENGINE_MODULE)
    engine = getattr(module, "StateCacheEngine", None)
    if engine is None or _bridged(activation, engine, "allocate_caches"):
        return
    installed = inspect.getattr_static(engine, "allocate_caches", None)
    if not isinstance(installed, staticmethod):  # lmdeploy's and dlinfer's both are; another kind is not ours to fix
        return
    forms = call_forms(engine, "allocate_caches")
    callee = _signature(installed.__func__)
    if not _needed(STATE_CACHE, patching.describe(installed), forms, callee, inspect.signature(_lmdeploy_allocate_form),
                   _STATE_CACHE_TAKES):
        return
    alignment = _field_default(getattr(module, "CacheDesc", None), "alignment")
    ours = staticmethod(state_cache_allocate(installed.__func__, alignment))
    _apply(activation, STATE_CACHE, patching.Patch(engine, "allocate_caches", ours))


def _watch_state_cache(activation: patching.Activation) -> None:
    check = functools.partial(_check_state_cache, activation)
    patching.when_imported(CACHE_ENGINE_MODULE, check)
    # dlinfer replaces allocate_caches when its lmdeploy extension is imported, usually after lmdeploy's module.
    patching.after_each_import(DLINFER_EXT_PREFIX, check)


# -- prefill-attention ---------------------------------------------------------------------------------------

_UNSET = object()


def _host(lengths: Any) -> Any:
    import torch

    return torch.as_tensor(lengths, device="cpu")


def _per_sequence(ends: Any) -> Any:
    """Per-sequence lengths from cumulative ends (``[3, 8, 10]`` -> ``[3, 5, 2]``)."""
    import torch

    return torch.diff(ends, prepend=ends.new_zeros(1))


def _cumulative(lengths: Any) -> Any:
    """Cumulative lengths with a leading zero (``[7, 5]`` -> ``[0, 7, 12]``)."""
    import torch

    return torch.cat((lengths.new_zeros(1), torch.cumsum(lengths, 0).to(lengths.dtype)))


def _with_zero(ends: Any) -> Any:
    """Cumulative ends with the leading zero (``[3, 8, 10]`` -> ``[0, 3, 8, 10]``): each sequence's start, and the
    total."""
    import torch

    return torch.cat((ends.new_zeros(1), ends))


def _on_device(host: Any, device: Any, dtype: str) -> Any:
    """``host`` (a host tensor) as ``dtype`` on ``device``: a host-to-device copy, queued without waiting for work
    already on the device (``non_blocking``); nothing is read back from the device."""
    import torch

    return host.to(device=device, dtype=getattr(torch, dtype), non_blocking=True)


@functools.lru_cache(maxsize=16)
def _parameters(op: Callable[..., Any]) -> frozenset[str] | None:
    signature = _signature(op)
    if signature is None or any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        return None
    return frozenset(signature.parameters)


def _call(op: Callable[..., Any], **values: Any) -> Any:
    """``op`` called by name with the values it has parameters for (unset values left to its defaults)."""
    names = _parameters(op)
    return op(**{k: v for k, v in values.items() if v is not _UNSET and (names is None or k in names)})


def adapt_prefill(op, query, key, value, key_cache, value_cache, q_seqlens, kv_seqlens, max_q_seq_len, num_q_heads,
                  num_kv_heads, attn_mask, *, softmax_scale=_UNSET, alibi_slopes=_UNSET, attn_output=_UNSET,
                  actual_seq_lengths_cpu):
    """lmdeploy 0.18's ``prefill_attention`` call (prefill without cache) made to dlinfer main's ``op``, Ascend.

    lmdeploy 0.16's Ascend backend passed per-sequence host lengths here, the same tensor for queries and keys
    (without a cache each sequence attends to its own tokens); 0.18 passes the cumulative host ends instead
    (``actual_seq_lengths_cpu``) besides device lengths (``q_seqlens``, ``kv_seqlens``), which are not used.
    ``q_start_loc`` becomes each sequence's host start offset (dlinfer's Ascend kernels do not read it)."""
    ends = _host(actual_seq_lengths_cpu)
    lengths = _per_sequence(ends)
    return _call(op, query=query, key=key, value=value, key_cache=key_cache, value_cache=value_cache,
                 q_start_loc=ends - lengths, q_seq_len=lengths, kv_seq_len=lengths, max_q_seq_len=max_q_seq_len,
                 num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, attn_mask=attn_mask,
                 softmax_scale=softmax_scale, alibi_slopes=alibi_slopes, attn_output=attn_output)


def adapt_paged_prefill(op, query, key, value, key_cache, value_cache, block_table, block_size, q_seq_len, kv_seq_len,
                        max_q_seq_len, max_kv_seq_len, num_q_heads, num_kv_heads, attn_mask, *, head_size_v=_UNSET,
                        softmax_scale=_UNSET, alibi_slopes=_UNSET, attn_output=_UNSET, kv_scales=_UNSET,
                        kv_zeros=_UNSET, quant_bits=_UNSET):
    """lmdeploy 0.18's ``paged_prefill_attention`` call (prefill over a cache) made to dlinfer main's ``op``, Ascend.

    0.18 passes the cumulative host query ends and per-sequence host KV lengths where dlinfer takes ``q_seq_len``
    and ``kv_seq_len``: the values lmdeploy 0.16's Ascend backend passed there (its ``q_seqlens`` cumulated for
    paged prefill), so they go on as they are. ``q_start_loc`` (host start offsets) and ``cu_seq_lens_kv`` (host
    cumulative KV lengths with a leading zero) are derived from them; dlinfer's Ascend kernel reads neither."""
    ends, kv_lengths = _host(q_seq_len), _host(kv_seq_len)
    return _call(op, query=query, key=key, value=value, key_cache=key_cache, value_cache=value_cache,
                 block_table=block_table, block_size=block_size, q_start_loc=ends - _per_sequence(ends),
                 q_seq_len=q_seq_len, kv_seq_len=kv_seq_len, cu_seq_lens_kv=_cumulative(kv_lengths),
                 max_q_seq_len=max_q_seq_len, max_kv_seq_len=max_kv_seq_len, num_q_heads=num_q_heads,
                 num_kv_heads=num_kv_heads, attn_mask=attn_mask, head_size_v=head_size_v,
                 softmax_scale=softmax_scale, alibi_slopes=alibi_slopes, attn_output=attn_output,
                 kv_scales=kv_scales, kv_zeros=kv_zeros, quant_bits=quant_bits)


@dataclass(frozen=True)
class PrefillLengths:
    """How lmdeploy 0.16/0.17's backend for one dlinfer vendor handed dlinfer's prefill ops their lengths
    (``docs/upstream.md``, Bridges): host tensors (Ascend), or the device tensors its ``update_step_context``
    built (Camb, MACA): cumulative query starts ``cu_seqlens`` (int32, batch + 1 entries) as ``q_start_loc``,
    per-sequence query lengths in ``q_seqlens_dtype``, int32 KV lengths, and for paged prefill the int32
    cumulative KV lengths (``cu_seq_lens_kv`` True) or None as ``cu_seq_lens_kv``."""

    vendor: str
    on_device: bool
    q_seqlens_dtype: str = "int32"
    cu_seq_lens_kv: bool = False


PREFILL_LENGTHS: dict[str, PrefillLengths] = {
    "ascend": PrefillLengths("ascend", on_device=False),
    # Camb passes StepContext.q_seqlens unconverted (lmdeploy's LongTensor) and builds cu_seq_lens_kv
    "camb": PrefillLengths("camb", on_device=True, q_seqlens_dtype="int64", cu_seq_lens_kv=True),
    # MACA converts q_seqlens with .int() and never sets cu_seq_lens_kv
    "maca": PrefillLengths("maca", on_device=True, q_seqlens_dtype="int32", cu_seq_lens_kv=False),
}
# the dlinfer vendors whose lmdeploy 0.16 prefill calls the bridge reproduces
PREFILL_VENDORS: tuple[str, ...] = tuple(PREFILL_LENGTHS)

# lmdeploy 0.18's kernel functions calling prefill_attention, and what their 0.16 form passed as q_start_loc: the
# paged kernel the attention metadata's (Camb's and MACA's cumulative cu_seqlens, batch + 1 entries: a causal
# prefill for their kernels), flash_attention_fwd its caller's per-sequence starts (batch entries, which dlinfer's
# Camb and MACA kernels run as non-causal: the vision towers'); 0.18 passes their sum with q_seqlens instead.
Q_START_LOC: dict[str, str] = {"prefill_attention": "cumulative", "flash_attention_fwd": "starts"}


def adapt_prefill_on_device(op, query, key, value, key_cache, value_cache, q_seqlens, kv_seqlens, max_q_seq_len,
                            num_q_heads, num_kv_heads, attn_mask, *, softmax_scale=_UNSET, alibi_slopes=_UNSET,
                            attn_output=_UNSET, actual_seq_lengths_cpu, q_start="cumulative"):
    """lmdeploy 0.18's ``prefill_attention`` call made to dlinfer's ``op`` as lmdeploy 0.16's Camb and MACA
    backends made it: ``q_seqlens`` and ``kv_seqlens`` (the device tensors 0.16 passed) go on as they are, and
    ``q_start_loc`` is rebuilt on the device from the host ends ``actual_seq_lengths_cpu``: the cumulative
    starts (int32, a leading zero) for the paged kernel (``q_start="cumulative"``), or for the flash kernel
    (``"starts"``), whose ends are ``q_start_loc + q_seqlens``, those ends less ``q_seqlens``."""
    ends = _host(actual_seq_lengths_cpu)
    if q_start == "starts":
        q_start_loc = ends.to(q_seqlens.device, non_blocking=True) - q_seqlens
    else:
        q_start_loc = _on_device(_with_zero(ends), query.device, "int32")
    return _call(op, query=query, key=key, value=value, key_cache=key_cache, value_cache=value_cache,
                 q_start_loc=q_start_loc, q_seq_len=q_seqlens, kv_seq_len=kv_seqlens, max_q_seq_len=max_q_seq_len,
                 num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, attn_mask=attn_mask,
                 softmax_scale=softmax_scale, alibi_slopes=alibi_slopes, attn_output=attn_output)


def adapt_paged_prefill_on_device(op, query, key, value, key_cache, value_cache, block_table, block_size, q_seq_len,
                                  kv_seq_len, max_q_seq_len, max_kv_seq_len, num_q_heads, num_kv_heads, attn_mask, *,
                                  head_size_v=_UNSET, softmax_scale=_UNSET, alibi_slopes=_UNSET, attn_output=_UNSET,
                                  kv_scales=_UNSET, kv_zeros=_UNSET, quant_bits=_UNSET, lengths):
    """lmdeploy 0.18's ``paged_prefill_attention`` call made to dlinfer's ``op`` as lmdeploy 0.16's Camb and
    MACA backends made it. 0.18 passes only host lengths here (cumulative query ends, per-sequence KV lengths:
    host copies of the device tensors those backends built); each device tensor 0.16 passed is rebuilt from
    them on the query's device, in 0.16's dtype (``lengths``): ``q_start_loc`` the cumulative starts,
    ``q_seq_len`` the per-sequence query lengths, ``kv_seq_len``, and ``cu_seq_lens_kv`` the cumulative KV
    lengths (Camb) or None (MACA)."""
    ends, kv_lengths = _host(q_seq_len), _host(kv_seq_len)
    device = query.device
    q_start_loc = _on_device(_with_zero(ends), device, "int32")
    cu_kv = _on_device(_cumulative(kv_lengths), device, "int32") if lengths.cu_seq_lens_kv else None
    return _call(op, query=query, key=key, value=value, key_cache=key_cache, value_cache=value_cache,
                 block_table=block_table, block_size=block_size, q_start_loc=q_start_loc,
                 q_seq_len=_on_device(_per_sequence(ends), device, lengths.q_seqlens_dtype),
                 kv_seq_len=_on_device(kv_lengths, device, "int32"), cu_seq_lens_kv=cu_kv,
                 max_q_seq_len=max_q_seq_len, max_kv_seq_len=max_kv_seq_len, num_q_heads=num_q_heads,
                 num_kv_heads=num_kv_heads, attn_mask=attn_mask, head_size_v=head_size_v,
                 softmax_scale=softmax_scale, alibi_slopes=alibi_slopes, attn_output=attn_output,
                 kv_scales=kv_scales, kv_zeros=kv_zeros, quant_bits=quant_bits)


# the call form each op is adapted from (lmdeploy 0.18's), and its Ascend adapter
ADAPTERS: dict[str, Callable[..., Any]] = {"prefill_attention": adapt_prefill,
                                            "paged_prefill_attention": adapt_paged_prefill}
_PREFILL_SUPPLIES = {
    "prefill_attention": ("query", "key", "value", "key_cache", "value_cache", "q_start_loc", "q_seq_len",
                          "kv_seq_len", "max_q_seq_len", "num_q_heads", "num_kv_heads", "attn_mask"),
    "paged_prefill_attention": ("query", "key", "value", "key_cache", "value_cache", "block_table", "block_size",
                                "q_start_loc", "q_seq_len", "kv_seq_len", "cu_seq_lens_kv", "max_q_seq_len",
                                "max_kv_seq_len", "num_q_heads", "num_kv_heads", "attn_mask"),
}


def _adapted_form(adapter: Callable[..., Any]) -> inspect.Signature:
    """The call form ``adapter`` accepts (its signature without the op)."""
    signature = inspect.signature(adapter)
    return signature.replace(parameters=list(signature.parameters.values())[1:])


def vendor_adapter(name: str, lengths: PrefillLengths, q_start: str = "cumulative") -> Callable[..., Any]:
    """The adapter of op ``name`` for the vendor of ``lengths`` (``q_start``: :data:`Q_START_LOC`'s form of the
    calling kernel, for ``prefill_attention`` on Camb and MACA)."""
    if not lengths.on_device:
        return ADAPTERS[name]
    if name == "prefill_attention":
        return functools.partial(adapt_prefill_on_device, q_start=q_start)
    return functools.partial(adapt_paged_prefill_on_device, lengths=lengths)


def bridged_op(ops: types.ModuleType, name: str, adapter: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """``ops.<name>`` (looked up at each call) taking lmdeploy 0.18's call form, through ``adapter`` (default the
    Ascend one, :data:`ADAPTERS`)."""
    adapter = adapter or ADAPTERS[name]

    def call(*args, **kwargs):
        return adapter(getattr(ops, name), *args, **kwargs)

    call.__name__ = name
    call.__qualname__ = f"{PREFILL_ATTENTION.name} bridge over {ops.__name__}.{name}"
    call.__doc__ = getattr(adapter, "func", adapter).__doc__
    call.__signature__ = _adapted_form(ADAPTERS[name])
    return call


class OpsView(types.ModuleType):
    """``dlinfer.ops`` as one lmdeploy kernel module sees it: the bridged ops adapted (``bridged``: their names,
    for the Ascend adapters, or each name with its adapter), every other name dlinfer's own (looked up at each
    use, so later changes to ``dlinfer.ops`` are seen)."""

    def __init__(self, ops: types.ModuleType, bridged: Collection[str] | dict[str, Callable[..., Any]]):
        super().__init__(ops.__name__, ops.__doc__)
        self.__dict__["__vendor_graph_ops__"] = ops
        adapters = bridged if isinstance(bridged, dict) else dict.fromkeys(bridged)
        for name, adapter in adapters.items():
            self.__dict__[name] = bridged_op(ops, name, adapter)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["__vendor_graph_ops__"], name)

    def __repr__(self) -> str:
        bridged = sorted(k for k in ADAPTERS if k in self.__dict__)
        return f"<{self.__name__} with {', '.join(bridged)} bridged by vendor_graph>"


def dlinfer_vendor() -> str | None:
    """The vendor the imported dlinfer was built for (its ``vendor.yaml``), or None."""
    vendor = getattr(sys.modules.get("dlinfer.vendor"), "vendor_name", None)
    return vendor() if callable(vendor) else vendor


def _q_start(module: Any, name: str, forms: list[CallForm], vendor: str) -> str | None:
    """The q_start_loc form (:data:`Q_START_LOC`) of ``module``'s calls ``forms`` to op ``name`` on a device-length
    vendor; None (with a warning) where a call is made from a kernel function whose 0.16 form the bridge does not
    know, or calls from different forms share the module (one view serves the whole module)."""
    if name != "prefill_attention":
        return "cumulative"  # only the paged kernel calls paged_prefill_attention: the attention metadata's
    found = {f.function: Q_START_LOC.get(f.function) for f in forms}
    kinds = set(found.values())
    if None not in kinds and len(kinds) == 1:
        return kinds.pop()
    logger.warning(
        "vendor_graph: lmdeploy's calls to %s.%s in %s (from %s) do not fit dlinfer's signature, and bridge %s does "
        "not know which q_start_loc lmdeploy 0.16 passed dlinfer's %s kernels there (it knows the calls from %s, "
        "one form per module): they will raise TypeError", DLINFER_OPS, name, module.__name__,
        ", ".join(map(str, found)), PREFILL_ATTENTION.name, vendor, ", ".join(Q_START_LOC))
    return None


def _check_kernels(activation: patching.Activation, module: Any) -> None:
    ops = sys.modules.get(DLINFER_OPS)
    if ops is None or module is None:
        return
    for alias in [k for k, v in vars(module).items() if v is ops]:
        if _bridged(activation, module, alias):
            continue
        bridged: dict[str, list[CallForm]] = {}
        for name, adapter in ADAPTERS.items():
            forms = call_forms(module, name, receivers=(alias,))
            if forms == []:
                continue
            callee = getattr(ops, name, None)
            if callee is not None and _needed(PREFILL_ATTENTION, f"{DLINFER_OPS}.{name}", forms, _signature(callee),
                                              _adapted_form(adapter), _PREFILL_SUPPLIES[name]):
                bridged[name] = forms
        if not bridged:
            continue
        vendor = dlinfer_vendor()
        lengths = PREFILL_LENGTHS.get(vendor)
        if lengths is None:
            logger.warning(
                "vendor_graph: lmdeploy's calls to %s.%s in %s do not fit dlinfer's signatures; bridge %s adapts "
                "them only for %s, whose kernels it hands what lmdeploy 0.16's backend for each passed, and "
                "dlinfer's vendor here is %s: they will raise TypeError",
                DLINFER_OPS, " / ".join(bridged), module.__name__, PREFILL_ATTENTION.name,
                ", ".join(PREFILL_VENDORS), vendor)
            continue
        adapters = {}
        for name, forms in bridged.items():
            q_start = _q_start(module, name, forms, vendor) if lengths.on_device else "cumulative"
            if q_start is not None:
                adapters[name] = vendor_adapter(name, lengths, q_start)
        if adapters:
            patch = patching.Patch(module, alias, OpsView(ops, adapters), owner_is_module=True)
            _apply(activation, PREFILL_ATTENTION, patch)


def _watch_prefill(activation: patching.Activation) -> None:
    check = functools.partial(_check_kernels, activation)
    patching.after_each_import(KERNELS_PACKAGE, check)
    for name in [n for n in sys.modules if n == KERNELS_PACKAGE or n.startswith(KERNELS_PACKAGE + ".")]:
        patching.when_imported(name, check)


__all__ = ["ADAPTERS", "BRIDGES", "BRIDGES_ENV", "NAMES", "PREFILL_ATTENTION", "PREFILL_LENGTHS", "PREFILL_VENDORS",
           "Q_START_LOC", "STATE_CACHE", "Applied", "Bridge", "CallForm", "OpsView", "PrefillLengths",
           "StateSpecsNotSupported", "adapt_paged_prefill", "adapt_paged_prefill_on_device", "adapt_prefill",
           "adapt_prefill_on_device", "allowed", "applied", "bridged_op", "call_forms", "dlinfer_vendor", "install",
           "state_cache_allocate", "vendor_adapter"]
