"""The Ascend room: what ``import vendor_graph.ascend`` installs, importable without activating anything.

The profile patches lmdeploy's ``CudaGraphMixin`` buffer methods with the Ascend spec (:mod:`.spec`) and
replaces what ``AscendOpsBackend.build_graph_runner`` builds with :class:`.runner.AscendGraphRunner`
(keeping the builder's side effects: ``AscendOpsBackend.enable_graph`` and ``max_batches``). lmdeploy's
Ascend MoE padding, which asks dlinfer's ``get_ascend_compatible_size``, is routed through the sizes of the
runner serving that step (:mod:`.moe`), so the MoE token count and the graph's batch always agree. Vendor
attention code registers its captured tasks through :func:`.hook.call_attention`.

Light to import: the profile and the names below are built on first use, so the release table and the other
facts modules (``releases``, ``seqlen``, ``limits``) import without torch.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

_EXPORTS = {"ascend_spec": "spec", "call_attention": "hook", "capturing": "hook", "seqlen_update_path": "seqlen"}


def _build_runner(original, *args, **kwargs):
    from . import moe
    from .runner import build_graph_runner  # torch and lmdeploy: only once lmdeploy builds a runner

    return moe.track(build_graph_runner(original, *args, **kwargs))


def _setup(activation) -> None:
    from . import dlinfer_adapter, moe

    dlinfer_adapter.check_installed()  # dlinfer-ascend 0.2.7 cannot decode with lmdeploy 0.16-0.18 at all
    moe.route(activation)
    # dlinfer's Ascend decode attention registers its captured tasks with our runner.
    dlinfer_adapter.install(activation)


@functools.cache
def _profile() -> Any:
    from ...install.profile import VendorProfile
    from ...sizing.buckets import ascend_capture_sizes
    from .spec import ascend_spec

    return VendorProfile(name="ascend", build_spec=ascend_spec, build_runner=_build_runner, extra_setup=_setup,
                         capture_rule=ascend_capture_sizes)


def __getattr__(name: str) -> Any:
    if name == "PROFILE":
        return _profile()
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["PROFILE", "ascend_spec", "call_attention", "capturing", "seqlen_update_path"]
