import dataclasses

import pytest

from vendor_graph.runtime.key import GraphKey


def test_graph_key_is_frozen_hashable_and_named():
    key = GraphKey(padded_batch=8, decoding=True, microbatch=False, query_len=2, extra=("mtp",))
    assert {key: 1}[GraphKey(8, True, False, 2, ("mtp",))] == 1
    assert key.padded_tokens == 16
    assert key.as_lmdeploy_tuple() == (8, True, False, 2, "mtp")
    with pytest.raises(dataclasses.FrozenInstanceError):
        key.padded_batch = 4


def test_graph_keys_differ_by_every_field():
    base = GraphKey(8, True)
    variants = [GraphKey(16, True), GraphKey(8, False), GraphKey(8, True, True), GraphKey(8, True, query_len=2),
                GraphKey(8, True, extra=(1,))]
    assert len({base, *variants}) == 6


@pytest.mark.parametrize("kwargs,err", [({"padded_batch": 0, "decoding": True}, ValueError),
                                        ({"padded_batch": 1, "decoding": True, "query_len": 0}, ValueError),
                                        ({"padded_batch": 1, "decoding": True, "extra": [1]}, TypeError)])
def test_graph_key_rejects_nonsense(kwargs, err):
    with pytest.raises(err):
        GraphKey(**kwargs)
