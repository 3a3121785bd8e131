"""lmdeploy releases we support, and the few places their API moved: detected where it can be (dataclass
fields, import paths), the version deciding only support. Where the facts come from: ``docs/upstream.md``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from packaging.version import InvalidVersion, Version

from ..config import settings
from . import breakages as upstream

# Release series (major.minor) each vendor supports. The .0 release of each is what CI tests.
SUPPORTED_SERIES: dict[str, tuple[str, ...]] = {
    "ascend": ("0.16", "0.17", "0.18"),
    "camb": ("0.16", "0.17", "0.18"),
    "maca": ("0.16", "0.17", "0.18"),
    "cuda": ("0.18",),
}

ALLOW_UNSUPPORTED_ENV = settings.variable("allow_unsupported_lmdeploy")

CUDAGRAPH_MODULE = "lmdeploy.pytorch.models.utils.cudagraph"
DLINFER_EXT_PREFIX = "dlinfer.framework.lmdeploy_ext"


class UnsupportedLmdeploy(RuntimeError):
    """The installed lmdeploy is not one this vendor supports."""


def installed_lmdeploy_version() -> Version | None:
    """The installed lmdeploy's version, read from package metadata (lmdeploy is not imported)."""
    try:
        raw = metadata.version("lmdeploy")
    except metadata.PackageNotFoundError:
        return None
    try:
        return Version(raw)
    except InvalidVersion:
        return None


def series(version: Version) -> str:
    return f"{version.major}.{version.minor}"


def vendors_supporting(version: Version) -> list[str]:
    """The dlinfer vendors (ascend, camb, maca) that support lmdeploy ``version``."""
    return [v for v in ("ascend", "camb", "maca") if series(version) in SUPPORTED_SERIES[v]]


def check_lmdeploy_supported(vendor: str, version: Version | None = None) -> Version:
    """Raise :class:`UnsupportedLmdeploy` unless the installed lmdeploy supports ``vendor``.

    ``VENDOR_GRAPH_ALLOW_UNSUPPORTED_LMDEPLOY=1`` (in the current settings) turns the refusal into a
    warning, to try a new release at your own risk (the caller logs it).
    """
    version = installed_lmdeploy_version() if version is None else version
    supported = SUPPORTED_SERIES[vendor]
    listed = ", ".join(f"{s}.x" for s in supported)
    if version is None:
        raise UnsupportedLmdeploy(
            f"vendor_graph.{vendor} needs lmdeploy, which is not installed; install one of {listed} "
            f"(pip install --no-deps lmdeploy==<version> keeps your vendor's torch)"
        )
    if series(version) in supported:
        return version
    breakage = upstream.refusal(vendor, series(version))
    why = f": {breakage.what}" if breakage else ""
    message = (
        f"vendor_graph.{vendor} does not support the installed lmdeploy {version}{why}. "
        f"Supported: {listed}. Install one of those, or set {ALLOW_UNSUPPORTED_ENV}=1 to try anyway."
    )
    if settings.current().allow_unsupported_lmdeploy:
        return version
    raise UnsupportedLmdeploy(message)


@dataclass(frozen=True)
class LmdeployApi:
    """The lmdeploy API facts the buffer specs depend on, detected from the installed classes."""

    version: Version
    attn_fields: frozenset[str]
    # 0.18 renamed DlinferAttentionMetadata.max_q_seq_len to max_q_seqlen.
    max_q_attr: str
    # 0.18 hands dlinfer attention host copies in separate fields (kv_seqlens_cpu, cu_seqlens_q_cpu);
    # up to 0.17 the Ascend backend put host tensors into kv_seqlens / q_seqlens themselves.
    separate_host_seqlens: bool

    @property
    def release(self) -> str:
        return series(self.version)


@functools.cache
def lmdeploy_api() -> LmdeployApi:
    from lmdeploy.pytorch.backends.dlinfer.attention import DlinferAttentionMetadata

    fields = frozenset(f.name for f in dataclasses.fields(DlinferAttentionMetadata))
    version = installed_lmdeploy_version()
    if version is None:
        import lmdeploy

        version = Version(lmdeploy.__version__)
    return LmdeployApi(
        version=version,
        attn_fields=fields,
        max_q_attr="max_q_seqlen" if "max_q_seqlen" in fields else "max_q_seq_len",
        separate_host_seqlens="kv_seqlens_cpu" in fields,
    )


def cuda_graph_runner_class() -> type:
    """lmdeploy's ``CUDAGraphRunner`` (a module up to 0.17, a package from 0.18; same import name)."""
    from lmdeploy.pytorch.backends.cuda.graph_runner import CUDAGraphRunner

    return CUDAGraphRunner


def cuda_single_graph_runner_class() -> type:
    """``CUDASingleGraphRunner``, which 0.18 moved to ``graph_runner.full_graph`` without re-export."""
    for module, name in (
        ("lmdeploy.pytorch.backends.cuda.graph_runner.full_graph", "CUDASingleGraphRunner"),
        ("lmdeploy.pytorch.backends.cuda.graph_runner", "CUDASingleGraphRunner"),
    ):
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    raise ImportError("CUDASingleGraphRunner not found in lmdeploy.pytorch.backends.cuda.graph_runner")


def cuda_runner_graphs(runner) -> dict:
    """A ``CUDAGraphRunner``'s map of graph key tuple -> ``CUDASingleGraphRunner`` (``_runner_map`` up to
    0.17, renamed ``_full_graph_runners`` in 0.18)."""
    if hasattr(runner, "_full_graph_runners"):
        return runner._full_graph_runners
    return runner._runner_map


def captured_cuda_graph(single_runner) -> Any:
    """The ``torch.cuda.CUDAGraph`` a ``CUDASingleGraphRunner`` replays (``USE_GRAPH`` up to 0.17,
    ``_use_graph`` in 0.18), or None where it replays none (fake capture) or this layout is unknown."""
    use = getattr(single_runner, "_use_graph", getattr(single_runner, "USE_GRAPH", None))
    graph = getattr(single_runner, "_graph", None)
    if use is not True or graph is None or not hasattr(single_runner, "meta"):
        return None
    return graph


def deepep_enabled() -> bool:
    """Whether lmdeploy's DeepEP state is on (its CUDA runner then sets the dispatch mode every step)."""
    global _deepep_state
    if _deepep_state is None:
        try:
            from lmdeploy.pytorch.backends.deepep_state import get_deepep_state
        except ImportError:
            get_deepep_state = None
        _deepep_state = get_deepep_state or (lambda: None)
    state = _deepep_state()
    return state is not None and bool(state.enabled())


_deepep_state: Any = None
