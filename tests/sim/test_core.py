"""Graph semantics of the simulator core on the generic ``torch.npu``."""

import gc

import pytest
import torch
from vendor_graph_sim import device as sim


def dev(*values, dtype=torch.float32):
    return torch.tensor(list(values), dtype=dtype, device="npu")


def capture(fn, pool=None, stream=None):
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g, pool=pool, stream=stream):
        out = fn()
    return g, out


def test_device_and_host_tensors_are_distinct():
    x = torch.zeros(3, device="npu")
    assert isinstance(x, sim.SimTensor) and x.device == torch.device("npu", 0) and x.is_npu
    host = x.cpu()
    assert type(host) is torch.Tensor and host.device.type == "cpu"
    assert (x + torch.tensor(2.0)).tolist() == [2.0, 2.0, 2.0]  # a 0-dim host tensor is a scalar
    with pytest.raises(RuntimeError, match="same device"):
        x + torch.ones(3)
    with pytest.raises(TypeError):
        x.numpy()


def test_eager_results_match_cpu():
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    with torch.no_grad():
        expected = lin(x).softmax(-1)
        got = lin.to("npu")(x.to("npu")).softmax(-1)
    torch.testing.assert_close(got.cpu(), expected)
    assert got.argmax(-1).tolist() == expected.argmax(-1).tolist()


def test_capture_writes_nothing_and_outputs_hold_poison():
    cache = torch.zeros(4, 2, device="npu")
    slots = dev(1, 3, dtype=torch.int64)
    x = dev(1.0, 2.0).view(2, 1).expand(2, 2).contiguous()
    g, (out, idx, flag) = capture(lambda: (cache.index_copy_(0, slots, x) * 2, slots + 1, x > 0))
    assert cache.cpu().eq(0).all()
    assert out._inner.isnan().all()
    assert idx._inner.eq(torch.iinfo(torch.int64).max).all() and flag._inner.all()
    g.replay()
    assert cache.cpu()[[1, 3]].tolist() == [[1.0, 1.0], [2.0, 2.0]]
    assert idx.tolist() == [2, 4]
    assert torch.equal(out.cpu(), cache.cpu() * 2)


def test_replay_reads_current_contents_of_the_same_tensors():
    x = dev(1.0, 2.0)
    g, y = capture(lambda: x * 10)
    for values in ([1.0, 2.0], [5.0, -1.0]):
        x.copy_(torch.tensor(values))
        g.replay()
        assert y.tolist() == [v * 10 for v in values]
    assert sim.counters.replays == 2


def test_host_list_and_host_tensor_passed_at_capture_stay_frozen():
    shifts, fill, host_index = [1], 3, torch.tensor([0, 2])
    x = torch.arange(4, dtype=torch.float32, device="npu")
    g, (rolled, filled, picked) = capture(lambda: (x.roll(shifts), torch.full([2], fill, device="npu"),
                                                   x[host_index]))
    shifts[0], fill = 2, 9
    host_index.copy_(torch.tensor([1, 1]))
    x.copy_(torch.tensor([10.0, 11.0, 12.0, 13.0]))
    g.replay()
    assert rolled.tolist() == [13.0, 10.0, 11.0, 12.0]  # device data is read live, the list was frozen
    assert filled.tolist() == [3.0, 3.0]
    assert picked.tolist() == [10.0, 12.0]


def test_custom_op_host_arguments_are_frozen_until_updated():
    from sim_test_ops import ops  # test-only stand-ins

    q = torch.ones(2, 3, device="npu")
    lens = [3, 5]
    host_lens = torch.tensor([3, 5], dtype=torch.int32)
    out = torch.empty(2, 3, device="npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        fia, _ = ops.npu_fused_infer_attention_score(q, q, q, actual_seq_lengths_kv=lens)
        ops._npu_paged_attention(q, q, q, 1, 1, 1.0, q, host_lens, out)
    lens[:] = [7, 9]
    host_lens.copy_(torch.tensor([7, 9]))
    g.replay()
    assert fia.cpu()[:, 0].tolist() == [3.0, 5.0]
    assert out.cpu()[:, 0].tolist() == [3.0, 5.0]


@pytest.mark.parametrize("sync", [
    lambda x: x[0].item(), lambda x: x.tolist(), lambda x: x.cpu(), lambda x: bool(x[0]), lambda x: x.nonzero(),
    lambda x: x[x > 0], lambda x: torch.npu.synchronize(), lambda x: x.copy_(torch.ones(2)),
    lambda x: torch.empty(2).copy_(x), lambda x: torch.tensor([1.0], device="npu"),
], ids=["item", "tolist", "cpu", "bool", "nonzero", "mask-index", "synchronize", "blocking-h2d", "blocking-d2h",
        "tensor-factory-h2d"])
def test_sync_during_capture_raises_and_aborts_the_capture(sync):
    x = dev(1.0, 2.0)
    g = torch.npu.NPUGraph()
    with pytest.raises(sim.SimCaptureError, match="capture"):
        with torch.npu.graph(g):
            y = x * 2
            sync(y)
    assert not torch.npu.is_current_stream_capturing()
    with pytest.raises(sim.SimCaptureError, match="capture failed"):
        g.replay()
    assert g.sim_graph.nodes == []
    g.reset()  # and the graph can be captured again
    with torch.npu.graph(g):
        z = x + 1
    g.replay()
    assert z.tolist() == [2.0, 3.0]


def test_ops_after_a_swallowed_capture_error_keep_failing():
    x = dev(1.0)
    g = torch.npu.NPUGraph()
    with pytest.raises(sim.SimCaptureError, match="invalidated"):
        with torch.npu.graph(g):
            with pytest.raises(sim.SimCaptureError):
                x.item()
            x.add(1)


def test_non_blocking_h2d_copy_is_captured_and_reads_the_host_buffer_at_replay():
    host = torch.tensor([1.0, 2.0])
    buf = torch.zeros(2, device="npu")
    g, y = capture(lambda: buf.copy_(host, non_blocking=True) * 3)
    host.copy_(torch.tensor([4.0, 5.0]))
    g.replay()
    assert y.tolist() == [12.0, 15.0]


def test_memory_allocated_during_capture_comes_from_the_pool_and_pools_are_shared():
    pool = torch.npu.graph_pool_handle()
    x = dev(1.0, 2.0)
    g1, y1 = capture(lambda: x + 1, pool=pool)
    g2, y2 = capture(lambda: x + 2, pool=pool)
    assert g1.pool() == g2.pool() == pool
    assert y1._alloc is not None and y1._alloc.pool is sim.pool_of(pool) is y2._alloc.pool
    g1.replay()
    g2.replay()
    assert (y1.tolist(), y2.tolist()) == ([2.0, 3.0], [3.0, 4.0])
    g3, y3 = capture(lambda: x + 3)
    assert y3._alloc.pool is not sim.pool_of(pool)


def test_freed_memory_of_a_shared_pool_is_reused_by_the_next_capture():
    pool = torch.npu.graph_pool_handle()
    x = dev(1.0, 2.0)
    g1, y1 = capture(lambda: x + 1, pool=pool)
    address = y1.data_ptr()
    del y1  # the caller drops graph 1's output: its block returns to the pool
    gc.collect()
    g2, y2 = capture(lambda: x * 0, pool=pool)
    assert y2.data_ptr() == address
    g2.replay()
    assert y2.tolist() == [0.0, 0.0]
    g1.replay()  # graph 1 still writes there: the other graph's output is clobbered
    assert y2.tolist() == [2.0, 3.0]


def test_factories_inside_capture_rerun_at_replay_and_empty_is_poisoned():
    x = dev(1.0, 2.0)

    def body():
        acc = torch.zeros(2, device="npu")
        acc.add_(x)
        return acc, torch.empty(2, device="npu")

    g, (acc, scratch) = capture(body)
    g.replay()
    g.replay()
    assert acc.tolist() == [1.0, 2.0]
    assert scratch._inner.isnan().all()


def test_a_tensor_made_like_another_is_an_allocation_as_empty_is():
    """``new_empty`` / ``new_empty_strided`` / ``empty_like`` allocate (poisoned; from the pool inside a capture)
    and issue nothing, like the ``empty`` factories: a device counts no kernel for them either."""
    x = dev(1.0, 2.0)
    with sim.count_ops() as c:
        made = [x.new_empty([3]), x.new_empty_strided((2,), (1,)), torch.empty_like(x), x.new_empty([0])]
    assert c.device_ops == 0 and not c.by_op
    assert all(sim.is_device_tensor(t) for t in made) and made[0]._inner.isnan().all()
    g, (scratch, out) = capture(lambda: (x.new_empty([2]), x * 2))
    assert scratch._alloc is not None and scratch._alloc.pool is sim.pool_of(g.pool())
    g.replay()
    assert out.tolist() == [2.0, 4.0]


def test_views_made_before_and_during_capture_alias_at_replay():
    base = torch.zeros(8, device="npu")
    head = base[:4]
    g, _ = capture(lambda: (head.add_(1), base[6:].fill_(5), base.view(2, 4)[1, 0:2].add_(2)))
    assert base.cpu().eq(0).all()
    g.replay()
    assert base.tolist() == [1, 1, 1, 1, 2, 2, 5, 5]


def test_inference_mode_capture_replays_outside_it():
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3).to("npu")
    x = torch.randn(2, 4, device="npu")
    with torch.inference_mode():
        g, y = capture(lambda: lin(x).relu().reshape(6))
    x.copy_(torch.randn(2, 4))
    g.replay()
    with torch.no_grad():
        torch.testing.assert_close(y.cpu(), lin(x).relu().reshape(6).cpu())


def test_device_op_counter_counts_what_a_step_issues():
    x = dev(1.0, 2.0)
    g, y = capture(lambda: (x * 2 + 1).relu())
    sim.reset_counters()
    x.copy_(torch.tensor([3.0, 4.0]))  # one H2D
    g.replay()  # one launch, however many nodes
    y.cpu()  # one D2H
    assert sim.counters.device_ops == 3
    assert sim.counters.by_op == {"copy_.h2d": 1, "graph.replay": 1, "d2h": 1}
    with sim.count_ops() as step:
        x.add_(1)
        x.view(2, 1)  # views are free
    assert step.device_ops == 1 and sim.counters.device_ops == 4


# ---------------------------------------------------------------------------------------------------
# streams and events


def test_lazy_mode_runs_nothing_until_a_sync_point(lazy):
    x = dev(1.0, 2.0)
    x.add_(1)
    y = x * 2
    assert x._inner.tolist() == [1.0, 2.0]
    assert sim.pending_work()
    assert y.tolist() == [4.0, 6.0]  # a host read drains the stream
    assert not sim.pending_work()


def test_lazy_mode_shows_a_host_buffer_rewritten_before_the_replay_ran(lazy):
    """Step N fills a host staging buffer and replays; step N+1 rewrites the buffer before the device ran."""
    staging = torch.zeros(2)
    inputs = torch.zeros(2, device="npu")
    g, out = capture(lambda: inputs.copy_(staging, non_blocking=True) + 0, stream=torch.npu.Stream())
    staging.copy_(torch.tensor([1.0, 2.0]))  # step N
    g.replay()
    staging.copy_(torch.tensor([7.0, 8.0]))  # step N+1 prepares while step N is still queued
    assert out.tolist() == [7.0, 8.0]  # step N's replay read step N+1's data: the race is observable
    with sim.configured(eager_drain=True):
        staging.copy_(torch.tensor([1.0, 2.0]))
        g.replay()
        staging.copy_(torch.tensor([7.0, 8.0]))
        assert out.tolist() == [1.0, 2.0]


def test_event_wait_holds_the_stream_until_the_event_is_recorded():
    side = torch.npu.Stream()
    gate = torch.npu.ExternalEvent()
    x = dev(1.0)
    with torch.npu.stream(side):
        gate.wait(side)  # wait before record: allowed for ExternalEvent
        x.add_(1)
    assert x._inner.tolist() == [1.0]  # held: the event is not recorded
    with pytest.raises(sim.SimDeadlockError, match="ExternalEvent"):
        side.synchronize()
    gate.record(torch.npu.current_stream())
    assert x.tolist() == [2.0]
    gate.reset()
    with torch.npu.stream(side):
        gate.wait()
        x.add_(1)
    assert x._inner.tolist() == [2.0]
    gate.record()
    side.synchronize()
    assert x._inner.tolist() == [3.0]


def test_discarding_queued_work_frees_a_device_a_failed_check_left_stuck():
    """What a failed test leaves queued (a replay held at a wait that is never recorded) must not stall or
    fail the next one: discard_queued_work empties every queue, ends an open capture, and the device syncs."""
    gate = torch.npu.ExternalEvent()
    x = dev(1.0)
    s = torch.npu.Stream()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g, stream=s):
        gate.wait(s)
        y = x + 1
    g.replay()
    with pytest.raises(sim.SimDeadlockError):
        torch.npu.synchronize()
    left_open = torch.npu.NPUGraph()
    with torch.npu.stream(torch.npu.Stream()):
        left_open.capture_begin()
    dropped = sim.discard_queued_work()
    assert any("replay" in d for d in dropped) and any("open capture" in d for d in dropped)
    assert torch.npu.current_stream() == torch.npu.default_stream()
    torch.npu.synchronize()
    assert (x + 1).tolist() == [2.0] and y._inner.isnan().all()  # the held replay never ran
    with pytest.raises(sim.SimCaptureError, match="left open"):
        left_open.replay()


def test_event_orders_two_streams(lazy):
    producer, consumer = torch.npu.Stream(), torch.npu.Stream()
    x = torch.zeros(1, device="npu")
    done = torch.npu.Event()
    with torch.npu.stream(producer):
        x.add_(5)
        done.record()
    with torch.npu.stream(consumer):
        done.wait()
        y = x * 2
    assert not done.query()
    consumer.synchronize()  # runs the producer as far as the consumer needs
    assert done.query() and y._inner.tolist() == [10.0]


def test_captured_external_event_wait_blocks_the_replay_until_recorded():
    gate = torch.npu.ExternalEvent()
    x = dev(1.0)
    s = torch.npu.Stream()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g, stream=s):
        gate.wait(s)
        gate.reset(s)
        y = x + 1
    g.replay()
    assert y._inner.isnan().all()  # held at the wait
    with pytest.raises(sim.SimDeadlockError):
        y.cpu()
    gate.record(torch.npu.Stream())  # a record queued behind the held replay on its own stream could never run
    assert y.tolist() == [2.0]
    with sim.configured(external_event_blocks_replay=False):
        x.fill_(5)
        g.replay()
        assert y.tolist() == [6.0]
