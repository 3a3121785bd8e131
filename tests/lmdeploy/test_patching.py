"""Patching the real lmdeploy classes: ownership, dlinfer displacement, uninstall, workers."""

import importlib
import logging
import os
import subprocess
import sys
import textwrap

import pytest

import vendor_graph
from vendor_graph.config import settings
from vendor_graph.install import patching
from vendor_graph.upstream import compat

RELEASE = compat.series(compat.installed_lmdeploy_version())
SUPPORTED_HERE = compat.vendors_supporting(compat.installed_lmdeploy_version())

BUFFER_METHODS = ("make_buffers_cudagraph", "fill_buffers_cudagraph", "update_context_cudagraph",
                  "support_cuda_graph")
OP_BACKENDS = {
    "ascend": ("lmdeploy.pytorch.backends.dlinfer.ascend.op_backend", "AscendOpsBackend"),
    "camb": ("lmdeploy.pytorch.backends.dlinfer.camb.op_backend", "CambOpsBackend"),
    "maca": ("lmdeploy.pytorch.backends.dlinfer.maca.op_backend", "MacaOpsBackend"),
}


def mixin():
    from lmdeploy.pytorch.models.utils.cudagraph import CudaGraphMixin

    return CudaGraphMixin


def owners(cls, names=BUFFER_METHODS):
    return {name: cls.__dict__.get(name) for name in names}


def op_backend(vendor):
    module, name = OP_BACKENDS[vendor]
    return getattr(importlib.import_module(module), name)


def test_methods_are_the_vendors_after_activation(vendor, activate):
    before = owners(mixin())
    activate(vendor)
    after = owners(mixin())
    for name in BUFFER_METHODS:
        assert after[name] is not before[name]
        assert after[name].__module__ == f"vendor_graph.{vendor}"
    assert vendor_graph.active_vendor() == vendor
    builder = op_backend(vendor).__dict__["build_graph_runner"]
    assert builder.__func__.__module__ == f"vendor_graph.{vendor}"


def test_uninstall_restores_the_originals_exactly(vendor, activate):
    try:
        from lmdeploy.pytorch.engine.executor.base import ExecutorBase
    except ImportError:  # an environment without the engine's own imports (pyzmq): nothing to reserve in
        ExecutorBase = None

    cls, backend = mixin(), op_backend(vendor)
    held = ("build_graph_runner", "update_step_context", "get_attention_metadata_cls")

    def state():
        executor = {} if ExecutorBase is None else {
            "_reserve_runtime_mem": ExecutorBase.__dict__["_reserve_runtime_mem"]}
        return owners(cls) | {name: backend.__dict__.get(name) for name in held} | executor

    before = state()
    activate(vendor)
    activate(vendor)  # idempotent: no second layer of patches
    # the mixin's four, the builder, the executor's graph-memory reservation, on Ascend the step-context
    # wrapper of the MoE padding, on Camb/MACA with lmdeploy 0.18 the metadata their update_step_context
    # builds (and the agent's update_params once its module is imported)
    patches = [p for p in patching.active().patches if p.name != "update_params"]
    metadata_fix = vendor != "ascend" and compat.lmdeploy_api().separate_host_seqlens
    assert len(patches) == 5 + (ExecutorBase is not None) + (vendor == "ascend") + metadata_fix, \
        [p.target for p in patches]
    vendor_graph.uninstall()
    assert state() == before
    assert vendor_graph.active_vendor() is None
    assert patching._finder not in sys.meta_path


def test_a_second_vendor_is_an_error(activate):
    if len(SUPPORTED_HERE) < 2:
        pytest.skip(f"lmdeploy {RELEASE} supports only {SUPPORTED_HERE}")
    first, second = SUPPORTED_HERE[:2]
    activate(first)
    with pytest.raises(patching.VendorConflict, match=f"vendor_graph.{first} is already active"):
        activate(second)
    assert vendor_graph.active_vendor() == first


def test_dlinfer_importing_after_us_is_undone_and_logged(vendor, activate, caplog, monkeypatch):
    monkeypatch.setenv("DLINFER_STUB_VENDOR", vendor)
    for name in [m for m in sys.modules if m.startswith("dlinfer.framework")]:
        monkeypatch.delitem(sys.modules, name)
    activate(vendor)
    ours = owners(mixin())
    with caplog.at_level(logging.WARNING, logger="vendor_graph"):
        # What lmdeploy does in every mp/Ray worker and in its environment check.
        from lmdeploy.utils import try_import_deeplink

        try_import_deeplink(vendor)
    assert owners(mixin()) == ours
    displaced = patching.active().displaced
    # dlinfer's Ascend module displaces support_cuda_graph as well; Camb's and MACA's leave lmdeploy's
    expected = set(BUFFER_METHODS) - ({"support_cuda_graph"} if vendor != "ascend" else set())
    assert {target.rsplit(".", 1)[-1] for target, _ in displaced} == expected
    assert all(f"{vendor}_cudagraph" in by for _, by in displaced)
    assert "had been replaced by dlinfer.framework.lmdeploy_ext.cudagraph" in caplog.text


def test_dlinfer_imported_before_us_is_displaced_and_restored_on_uninstall(vendor, activate, monkeypatch):
    monkeypatch.setenv("DLINFER_STUB_VENDOR", vendor)
    for name in [m for m in sys.modules if m.startswith("dlinfer.framework")]:
        monkeypatch.delitem(sys.modules, name)
    importlib.import_module("dlinfer.framework.lmdeploy_ext")
    theirs = owners(mixin())
    displaced = {n: fn for n, fn in theirs.items() if vendor == "ascend" or n != "support_cuda_graph"}
    assert all(f"{vendor}_cudagraph" in fn.__module__ for fn in displaced.values())
    activate(vendor)
    assert all(fn.__module__ == f"vendor_graph.{vendor}" for fn in owners(mixin()).values())
    vendor_graph.uninstall()
    assert owners(mixin()) == theirs


def test_ownership_is_checked_where_the_runner_is_built_and_before_each_capture(vendor, activate, caplog):
    from vendor_graph.runtime.key import GraphKey
    from vendor_graph.runtime.step import StepView

    activate(vendor)
    ours = owners(mixin())
    mixin().fill_buffers_cudagraph = lambda *a, **k: None  # someone patches behind our back
    runner = _build_runner(vendor)
    assert owners(mixin()) == ours
    assert "noticed before building the graph runner" in caplog.text
    mixin().make_buffers_cudagraph = lambda *a, **k: None
    runner.view = lambda kwargs: StepView(None, 1, GraphKey(1, True), None)  # a step whose key has no graph yet
    try:
        runner(input_ids=None)
    except Exception:
        pass  # the fake model cannot run; the check comes first
    assert owners(mixin()) == ours
    assert "noticed before a capture" in caplog.text


def _build_runner(vendor, capture_sizes=None):
    """Call the patched builder the way lmdeploy's ModelAgent does, with CPU stand-ins."""
    from types import SimpleNamespace

    import torch

    class Model(torch.nn.Module):
        ctx_mgr = SimpleNamespace(build_ctx=SimpleNamespace(strategy_factory=None))

    model_config = SimpleNamespace(k_head_dim=64, v_head_dim=64, model_paradigm="ar", use_flash_mla=False)
    cache_config = SimpleNamespace(max_batches=8, num_gpu_blocks=16, cudagraph_capture_batch_sizes=capture_sizes)
    backend_config = SimpleNamespace(eager_mode=False, device_type=vendor, piecewise_cudagraph_max_tokens=None)
    backend = op_backend(vendor)
    if vendor == "ascend":
        return backend.build_graph_runner(Model(), model_config, cache_config, backend_config, "cpu")
    # lmdeploy's CUDA runner asks torch.cuda for a graph pool at construction; give it a CPU stand-in.
    import torch.cuda

    real = torch.cuda.graph_pool_handle
    torch.cuda.graph_pool_handle = lambda: (0, 0)
    try:
        strategy = SimpleNamespace(build_cudagraph_strategy=lambda: None)
        Model.ctx_mgr = SimpleNamespace(build_ctx=SimpleNamespace(strategy_factory=strategy))
        return backend.build_graph_runner(Model(), model_config, cache_config, backend_config, "cpu")
    finally:
        torch.cuda.graph_pool_handle = real


def test_ascend_builder_builds_our_runner_and_keeps_lmdeploys_side_effects(activate, monkeypatch):
    if "ascend" not in SUPPORTED_HERE:
        pytest.skip("ascend unsupported here")
    for name in [m for m in sys.modules if m.startswith("dlinfer.framework")]:
        monkeypatch.delitem(sys.modules, name)
    activate("ascend")
    from vendor_graph.vendors.ascend.runner import AscendGraphRunner

    backend = op_backend("ascend")
    backend.enable_graph, backend.max_batches = False, None
    runner = _build_runner("ascend")
    assert isinstance(runner, AscendGraphRunner)
    assert backend.enable_graph is True and backend.max_batches == 8
    assert runner.get_capture_batch_sizes() == [1, 2, 4, 8]
    # lmdeploy's builder imported dlinfer's runner module; ours must not need it
    assert "dlinfer.framework.lmdeploy_ext.cudagraph.ascend_cudagraph" not in sys.modules


def test_ascend_moe_padding_follows_the_runners_sizes(activate, monkeypatch):
    if "ascend" not in SUPPORTED_HERE:
        pytest.skip("ascend unsupported here")
    monkeypatch.setenv("DLINFER_STUB_VENDOR", "ascend")
    for name in [m for m in sys.modules if m.startswith("dlinfer.framework")]:
        monkeypatch.delitem(sys.modules, name)
    activate("ascend")
    runner = _build_runner("ascend", capture_sizes=[3, 6])
    assert runner.get_capture_batch_sizes() == [3, 6, 8]
    # What lmdeploy's Ascend update_step_context imports for MoE padding (EP > 1, graph mode)
    from dlinfer.framework.lmdeploy_ext.cudagraph.ascend_cudagraph import get_ascend_compatible_size

    assert [get_ascend_compatible_size(b) for b in (1, 3, 4, 7, 8)] == [3, 3, 6, 8, 8]
    vendor_graph.uninstall()
    module = sys.modules["dlinfer.framework.lmdeploy_ext.cudagraph.ascend_cudagraph"]
    assert module.get_ascend_compatible_size(4) == 4  # dlinfer's own again


def test_unsupported_release_is_refused_with_versions_named(monkeypatch):
    from packaging.version import Version

    with pytest.raises(compat.UnsupportedLmdeploy,
                       match=r"lmdeploy 0\.15\.0\. Supported: 0\.16\.x, 0\.17\.x, 0\.18\.x"):
        compat.check_lmdeploy_supported("camb", Version("0.15.0"))
    with pytest.raises(compat.UnsupportedLmdeploy, match=r"lmdeploy 0\.19\.0\. Supported: .*0\.18\.x. Install"):
        compat.check_lmdeploy_supported("maca", Version("0.19.0"))
    monkeypatch.setenv(compat.ALLOW_UNSUPPORTED_ENV, "1")
    settings.load()  # as activation does
    assert compat.check_lmdeploy_supported("camb", Version("0.19.0")) == Version("0.19.0")


def _run_child(code, env_extra, timeout=120):
    env = dict(os.environ, **env_extra)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=timeout)


def test_autoload_costs_nothing_in_unrelated_processes():
    proc = _run_child("""
        import sys
        heavy = [m for m in ("torch", "lmdeploy", "numpy", "vendor_graph.buffers") if m in sys.modules]
        print(heavy, "vendor_graph.install.autoload" in sys.modules)
    """, {"VENDOR_GRAPH_VENDOR": SUPPORTED_HERE[0]})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[] True"
    proc = _run_child("import sys; print('vendor_graph' in sys.modules)", {"VENDOR_GRAPH_VENDOR": ""})
    assert proc.stdout.strip() == "False"


CHILD_REPORT = """
    import os, sys
    if {import_dlinfer_first}:
        import dlinfer.framework.lmdeploy_ext
    from lmdeploy.pytorch.models.utils.cudagraph import CudaGraphMixin
    import lmdeploy.pytorch.backends.dlinfer.{vendor}.op_backend as ob
    from lmdeploy.utils import try_import_deeplink
    try_import_deeplink("{vendor}")
    names = ("make_buffers_cudagraph", "fill_buffers_cudagraph", "update_context_cudagraph")
    print(sorted({{getattr(CudaGraphMixin, n).__module__ for n in names}}))
    print(type(ob).__name__, ob.{cls}.__dict__["build_graph_runner"].__func__.__module__)
"""


@pytest.mark.parametrize("dlinfer_first", [False, True], ids=["dlinfer-after", "dlinfer-before"])
def test_workers_activate_from_the_environment(vendor, dlinfer_first):
    code = CHILD_REPORT.format(vendor=vendor, cls=OP_BACKENDS[vendor][1], import_dlinfer_first=dlinfer_first)
    proc = _run_child(code, {"VENDOR_GRAPH_VENDOR": vendor, "DLINFER_STUB_VENDOR": vendor})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == f"['vendor_graph.{vendor}']"
    assert lines[1] == f"module vendor_graph.{vendor}"


def _spawned_worker(queue, vendor):
    """What lmdeploy's mp executor does in a worker: import the graph module, then dlinfer's extension."""
    from lmdeploy.pytorch.models.utils.cudagraph import CudaGraphMixin
    from lmdeploy.utils import try_import_deeplink

    try_import_deeplink(vendor)
    queue.put(CudaGraphMixin.fill_buffers_cudagraph.__module__)


def test_spawned_worker_of_an_activated_parent_runs_our_methods(vendor, activate, monkeypatch):
    import multiprocessing

    monkeypatch.setenv("DLINFER_STUB_VENDOR", vendor)
    activate(vendor)
    assert os.environ["VENDOR_GRAPH_VENDOR"] == vendor  # exported for the workers
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    worker = ctx.Process(target=_spawned_worker, args=(queue, vendor))
    worker.start()
    worker.join(120)
    assert worker.exitcode == 0
    assert queue.get(timeout=5) == f"vendor_graph.{vendor}"
    vendor_graph.uninstall()
    assert "VENDOR_GRAPH_VENDOR" not in os.environ


def test_compat_finds_the_moved_runner_classes():
    single = compat.cuda_single_graph_runner_class()
    assert single.__name__ == "CUDASingleGraphRunner"
    expected = "full_graph" if RELEASE >= "0.18" else "graph_runner"
    assert single.__module__.endswith(expected)
    assert compat.cuda_graph_runner_class().__name__ == "CUDAGraphRunner"
    api = compat.lmdeploy_api()
    assert api.max_q_attr == ("max_q_seqlen" if RELEASE >= "0.18" else "max_q_seq_len")
    assert api.separate_host_seqlens == (RELEASE >= "0.18")


def test_cuda_runner_graphs_reads_the_map_of_either_release_even_when_empty():
    from types import SimpleNamespace

    old, new = SimpleNamespace(_runner_map={}), SimpleNamespace(_full_graph_runners={})
    assert compat.cuda_runner_graphs(old) is old._runner_map
    assert compat.cuda_runner_graphs(new) is new._full_graph_runners  # an empty 0.18 map is not "missing"


def test_ascend_moe_padding_follows_the_runner_of_the_step_being_prepared(activate, monkeypatch):
    """A target and its draft model have their own runners and sizes: lmdeploy's MoE padding, computed in
    AscendOpsBackend.update_step_context, must use the sizes of the runner whose graph that step takes."""
    if "ascend" not in SUPPORTED_HERE:
        pytest.skip("ascend unsupported here")
    from types import SimpleNamespace

    monkeypatch.setenv("DLINFER_STUB_VENDOR", "ascend")
    for name in [m for m in sys.modules if m.startswith("dlinfer.framework")]:
        monkeypatch.delitem(sys.modules, name)
    backend = op_backend("ascend")
    padded = {}

    def update_step_context(cls, step_context):  # lmdeploy's MoE padding (EP > 1, graph mode) happens here
        from dlinfer.framework.lmdeploy_ext.cudagraph.ascend_cudagraph import get_ascend_compatible_size

        padded[step_context.name] = [get_ascend_compatible_size(b) for b in (1, 4, 7)]
        return step_context

    monkeypatch.setattr(backend, "update_step_context", classmethod(update_step_context))
    activate("ascend")
    target = _build_runner("ascend", capture_sizes=[3, 6])
    draft = _build_runner("ascend", capture_sizes=[5])  # built last: a process-wide answer would be its
    for name, runner in (("target", target), ("draft", draft)):
        backend.update_step_context(SimpleNamespace(model_config=runner.model_config, name=name))
    assert padded == {"target": [3, 6, 8], "draft": [5, 5, 8]}
    vendor_graph.uninstall()
    assert backend.__dict__["update_step_context"].__func__ is update_step_context
