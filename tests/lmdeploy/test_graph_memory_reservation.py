"""Graph memory kept out of the KV cache, on lmdeploy's own executor sizing: ``ExecutorBase.update_configs``
of the installed release (0.16-0.18) runs unchanged, over a fake device's free memory, and the cache
it sizes leaves the graphs' reservation free."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from vendor_graph import vendors
from vendor_graph.config import settings
from vendor_graph.sizing import capacity
from vendor_graph.sizing.capacity import CapturePlanError

base = pytest.importorskip("lmdeploy.pytorch.engine.executor.base")
from lmdeploy.pytorch.config import CacheConfig  # noqa: E402

MiB = 2**20
FREE = 4096 * MiB
BLOCK = 2 * MiB  # bytes of one KV-cache block, every layer
VOCAB = 32000


class Executor(base.ExecutorBase):
    """lmdeploy's executor sizing with the worker calls answered here (one rank, no model)."""

    def __init__(self, max_batches=64, ratio=0.5, eager=False, ranks=1):
        self.model_config = SimpleNamespace(vocab_size=VOCAB, mla_index_topk=None, states_shapes=[],
                                            update_cache_config_func=None, use_flash_mla=False, k_head_dim=128,
                                            sliding_window=-1)
        self.cache_config = CacheConfig(max_batches=max_batches, block_size=64, num_cpu_blocks=0, num_gpu_blocks=0,
                                        cache_max_entry_count=ratio, max_prefill_token_num=4096)
        self.backend_config = SimpleNamespace(eager_mode=eager)
        self.misc_config = SimpleNamespace(memdecode_config=None)
        self.specdecode_config = None
        self.dist_config = SimpleNamespace(attn_tp=1, dp=1, world_size=ranks)
        self.ranks = ranks

    # what the workers would answer
    def gather_free_mem(self):
        return [FREE] * self.ranks

    def _prepare_worker_cache_plans(self, cache_config, spec_cache_config=None):  # 0.18
        return [base._WorkerCachePlanSizes(target=BLOCK)] * self.ranks

    def _get_cache_block_sizes(self, spec_cache_config, spec_model_config):  # 0.16, 0.17
        return base._CacheBlockSize(target=BLOCK)

    def set_cache_config(self, cache_config, spec_cache_config=None):
        pass

    def set_model_config(self, model_config, spec_model_config=None):
        pass

    def _adjust_block_size(self):
        pass

    def _maybe_disable_unsupported_prefix_caching(self, *args, **kwargs):
        pass


def _sized(monkeypatch, activate, env: dict[str, str] | None = None, **kwargs) -> Executor:
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    if activate is not None:
        activate(_vendor())
    settings.load()
    executor = Executor(**kwargs)
    executor.update_configs()
    return executor


def _blocks(monkeypatch, activate, env: dict[str, str] | None = None, **kwargs) -> int:
    return _sized(monkeypatch, activate, env, **kwargs).cache_config.num_gpu_blocks


def _reserved(executor) -> int:
    return getattr(executor.cache_config, capacity.RESERVED_ATTR)


def _vendor() -> str:
    return "cuda" if "cuda" in _supported() else _supported()[0]


def _supported():
    from vendor_graph.upstream import compat

    return compat.vendors_supporting(compat.installed_lmdeploy_version())


def _runtime(max_batches=64) -> int:
    return (4096 + max_batches * 2) * VOCAB * 2


def test_without_vendor_graph_lmdeploy_sizes_the_cache_from_all_free_memory(monkeypatch):
    assert _blocks(monkeypatch, None) == int((FREE - _runtime()) * 0.5) // BLOCK


def test_an_explicit_reservation_is_left_out_of_the_cache(monkeypatch, activate):
    executor = _sized(monkeypatch, activate, {"VENDOR_GRAPH_GRAPH_MEMORY": "512MiB"})
    assert executor.cache_config.num_gpu_blocks == int((FREE - _runtime() - 512 * MiB) * 0.5) // BLOCK
    assert _reserved(executor) == 512 * MiB  # what the workers' runners report
    assert isinstance(base.ExecutorBase.__dict__["_reserve_runtime_mem"].__wrapped__, type(lambda: 0))


def _stats(path, **extra):
    doc = {"format": "vendor_graph.stats/1", "vendor": _vendor(), "max_batches": 64,
           "capture_sizes": [1, 2, 4, 8, 16, 32, 64], "batch_histogram": {"3": 5}, "graph_memory_bytes": 200 * MiB}
    path.write_text(json.dumps({**doc, **extra}))


def test_auto_reserves_the_previous_pool_and_this_plans_buffers(monkeypatch, activate, tmp_path):
    path = tmp_path / "stats.json"
    _stats(path)
    executor = _sized(monkeypatch, activate, {"VENDOR_GRAPH_STATS_FILE": str(path)})
    reserved = _reserved(executor)
    # the measured pool, plus the buffers of this run's 7 graphs at the cache about to be made, with the margin
    blocks_upper = int((FREE - _runtime()) * 0.5) // BLOCK
    spec = vendors.profile(_vendor()).spec
    sizes = vendors.profile(_vendor()).capture_sizes(64)  # the vendor's default for max_batch_size 64
    buffers = capacity._buffer_bytes(spec, sizes, blocks_upper, 1)
    assert buffers >= sum(sizes) * blocks_upper * 4  # each graph's block table: batch x blocks int32
    assert reserved == int((200 * MiB + buffers) * capacity.MARGIN)
    assert executor.cache_config.num_gpu_blocks == int((FREE - _runtime() - reserved) * 0.5) // BLOCK
    # twice the recorded max_batch_size: the pool scaled with it
    bigger = _sized(monkeypatch, activate, max_batches=128)
    assert _reserved(bigger) > int(2 * 200 * MiB * capacity.MARGIN)


def test_auto_takes_the_recorded_buffers_out_of_the_recorded_memory(monkeypatch, activate, tmp_path):
    """A previous run with a larger cache had larger block tables: only its pool carries over."""
    path = tmp_path / "stats.json"
    sizes = vendors.profile(_vendor()).capture_sizes(64)
    spec = vendors.profile(_vendor()).spec
    then = capacity._buffer_bytes(spec, sizes, 100_000, 1)
    _stats(path, graph_memory_bytes=then + 50 * MiB, num_gpu_blocks=100_000,
           buckets={str(s): {"captures": 1} for s in sizes})
    executor = _sized(monkeypatch, activate, {"VENDOR_GRAPH_STATS_FILE": str(path)})
    blocks_upper = int((FREE - _runtime()) * 0.5) // BLOCK
    assert _reserved(executor) == int((50 * MiB + capacity._buffer_bytes(spec, sizes, blocks_upper, 1))
                                      * capacity.MARGIN)


def test_the_buffer_model_is_the_block_table_per_graph(activate):
    from vendor_graph.buffers import GraphDims

    activate(_vendor())
    spec = vendors.profile(_vendor()).spec
    small, large = (spec.device_bytes(GraphDims(8, 8, blocks, 1)) for blocks in (1000, 3000))
    assert large - small == 8 * 2000 * 4  # block_offsets: (batch, blocks) int32, nothing else grows with blocks


def test_auto_with_no_stats_yet_or_off_reserves_nothing(monkeypatch, activate, tmp_path):
    plain = int((FREE - _runtime()) * 0.5) // BLOCK
    executor = _sized(monkeypatch, activate, {"VENDOR_GRAPH_STATS_FILE": str(tmp_path / "none.json")})
    assert executor.cache_config.num_gpu_blocks == plain and _reserved(executor) == 0
    monkeypatch.setenv("VENDOR_GRAPH_GRAPH_MEMORY", "off")
    settings.load()
    executor = Executor()
    executor.update_configs()
    assert executor.cache_config.num_gpu_blocks == plain and _reserved(executor) == 0


def test_eager_mode_reserves_nothing(monkeypatch, activate):
    plain = int((FREE - _runtime()) * 0.5) // BLOCK
    assert _blocks(monkeypatch, activate, {"VENDOR_GRAPH_GRAPH_MEMORY": "1GiB"}, eager=True) == plain


def test_every_rank_keeps_the_reservation(monkeypatch, activate):
    blocks = _blocks(monkeypatch, activate, {"VENDOR_GRAPH_GRAPH_MEMORY": "256MiB"}, ranks=2)
    assert blocks == int((FREE - _runtime() - 256 * MiB) * 0.5) // BLOCK


def test_a_reservation_larger_than_the_memory_left_is_refused_with_the_fix(monkeypatch, activate):
    with pytest.raises(CapturePlanError, match="lower VENDOR_GRAPH_GRAPH_MEMORY"):
        _blocks(monkeypatch, activate, {"VENDOR_GRAPH_GRAPH_MEMORY": "8GiB"})


def test_the_runner_reports_what_the_executor_reserved(monkeypatch, activate):
    from vendor_graph.runtime import adopted

    executor = _sized(monkeypatch, activate, {"VENDOR_GRAPH_GRAPH_MEMORY": "64MiB"})
    plan = capacity.resolve_capture_plan(_vendor(), 64, [1, 64], None,
                                         reserved_bytes=getattr(executor.cache_config, capacity.RESERVED_ATTR))
    assert plan.reserved_bytes == 64 * MiB
    assert "RESERVED_ATTR" in adopted.AdoptedRunner._vendor_graph_init.__code__.co_names


def test_uninstall_gives_lmdeploy_its_method_back(activate):
    original = base.ExecutorBase.__dict__["_reserve_runtime_mem"]
    activate(_supported()[0])
    assert base.ExecutorBase.__dict__["_reserve_runtime_mem"] is not original
    import vendor_graph

    vendor_graph.uninstall()
    assert base.ExecutorBase.__dict__["_reserve_runtime_mem"] is original
