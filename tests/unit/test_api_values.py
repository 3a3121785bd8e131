"""The public API takes what Python callers pass (numpy integers, integer arrays, any sequence of ints) or refuses
it with a TypeError/ValueError naming the argument and the type expected, never with a message from deep inside
(numpy's "truth value of an array is ambiguous", "int too large to convert to float", "'int' object has no
attribute 'strip'")."""

from __future__ import annotations

import decimal
import importlib.util
import io
import sys

import pytest

from vendor_graph.config import settings
from vendor_graph.sizing import buckets, capacity, planning
from vendor_graph.sizing.buckets import ascend_bucket, ascend_capture_sizes

HUGE = 10**5000  # above Python's 4300-digit limit for printing an int
DEEP_ERRORS = ("truth value of an array", "too large to convert to float", "has no attribute", "not iterable",
               "Exceeds the limit", "argument should be a string or a Rational")
HAVE_NUMPY = importlib.util.find_spec("numpy") is not None
needs_numpy = pytest.mark.skipif(not HAVE_NUMPY, reason="numpy is not installed here")


class Index:
    """An integer that is not an int (what a numpy integer scalar is to Python): it has ``__index__``."""

    def __init__(self, value: int):
        self.value = value

    def __index__(self) -> int:
        return self.value


def _empty() -> settings.Settings:
    return settings.parse({})


ACCEPTED = [
    (lambda: buckets.cuda_capture_sizes(Index(8)), [1, 2, 4, 8]),
    (lambda: buckets.explicit_capture_sizes(range(1, 4), 8), [1, 2, 3, 8]),
    (lambda: buckets.explicit_capture_sizes((Index(4), 2), 8), [2, 4, 8]),
    (lambda: buckets.explicit_capture_sizes(iter([4, 2]), Index(8)), [2, 4, 8]),
    (lambda: buckets.pad_to_bucket((1, 2, 4), Index(3)), 4),
    (lambda: buckets.pad_to_bucket(range(1, 9), 3), 3),
    (lambda: buckets.pad_to_bucket([Index(1), Index(4)], 3), 4),
    (lambda: ascend_bucket(Index(17)), 32),
    (lambda: ascend_capture_sizes(Index(20)), [1, 2, 4, 8, 16, 20]),
    (lambda: planning.fit_sizes({Index(3): Index(5), 6: 2.5}, Index(8), Index(2), required=range(0)), [3, 8]),
    (lambda: planning.fit_sizes({3: 1}, 8, 3, required=(Index(4),)), [3, 4, 8]),
    (lambda: planning.padded_tokens({3: 1}, range(4, 9, 4)), 1.0),
    (lambda: planning.padded_tokens({3: 2**62}, [4]), float(2**62)),
    (lambda: capacity.resolve_capture_plan("cuda", Index(8), range(1, 9), (Index(2), 4), current=_empty()).sizes,
     (2, 4, 8)),
    (lambda: settings.parse({"VENDOR_GRAPH_SHADOW": "3", "VENDOR_GRAPH_DEBUG": None, 7: 7}).shadow, 3),
]

REFUSED = [  # (call, exception type, words the message must hold)
    (lambda: buckets.cuda_capture_sizes(decimal.Decimal(8)), TypeError, ["max_batches must be an int", "Decimal"]),
    (lambda: buckets.cuda_capture_sizes(8.0), TypeError, ["max_batches must be an int", "float"]),
    (lambda: buckets.cuda_capture_sizes(True), TypeError, ["max_batches must be an int", "bool"]),
    (lambda: buckets.cuda_capture_sizes(HUGE), ValueError, ["max_batches an int of about 5001 digits is above 65536"]),
    (lambda: buckets.explicit_capture_sizes(5, 8), TypeError, ["cudagraph_capture_batch_sizes must be a sequence",
                                                               "5 (int)"]),
    (lambda: buckets.explicit_capture_sizes("124", 8), TypeError, ["cudagraph_capture_batch_sizes must be a sequence",
                                                                   "(str)"]),
    (lambda: buckets.explicit_capture_sizes([2.5], 8), TypeError, ["must be positive ints", "2.5 (float)"]),
    (lambda: buckets.pad_to_bucket(None, 2), TypeError, ["capture_sizes must be a sequence of ints", "None"]),
    (lambda: buckets.pad_to_bucket("124", 2), TypeError, ["capture_sizes must be a sequence of ints", "(str)"]),
    (lambda: buckets.pad_to_bucket([1, 2, 4], HUGE), ValueError, ["batch an int of about 5001 digits has no graph"]),
    # found by tests/fuzz/test_api_values.py: the message itself failed to print a huge size
    (lambda: buckets.pad_to_bucket([HUGE, 1], 1), ValueError, ["capture sizes [an int of about 5001 digits, 1] are not "
                                                               "positive and strictly ascending"]),
    (lambda: buckets.pad_to_bucket([1, HUGE], -HUGE), ValueError, ["batch an int of about 5001 digits has no graph",
                                                                   "1 <= batch <= an int of about 5001 digits"]),
    (lambda: buckets.explicit_capture_sizes([HUGE], 8), ValueError, ["[an int of about 5001 digits] are all above "
                                                                     "max_batch_size 8"]),
    (lambda: buckets.explicit_capture_sizes([-HUGE], 8), ValueError, ["must be positive ints, got [an int of"]),
    (lambda: buckets.pad_to_bucket([1, 2, 4], decimal.Decimal(2)), TypeError, ["batch must be an int", "Decimal"]),
    (lambda: ascend_bucket(10**400), ValueError, ["batch must be from 1 to 65536", "about 401 digits"]),
    (lambda: planning.fit_sizes([3, 4], 8, 2), ValueError, ["weights must be a mapping", "(list)"]),
    (lambda: planning.fit_sizes({3: decimal.Decimal("1.5")}, 8, 2), ValueError, ["weight Decimal('1.5') is not a "
                                                                                 "finite number (an int or a float)"]),
    (lambda: planning.fit_sizes({3: 10**400}, 8, 2), ValueError, ["weight is an int of about 401 digits, above"]),
    (lambda: planning.padded_fraction({3: 10**400}, [8]), ValueError, ["above 9223372036854775807"]),
    (lambda: planning.fit_sizes({3: 1}, 8, 2, 4), ValueError, ["required must be a sequence of ints", "4 (int)"]),
    (lambda: planning.fit_sizes({3: 1}, 8, 2.0), ValueError, ["max_graphs 2.0 is not a whole number"]),
    (lambda: planning.padded_tokens({3: 1}, 8), ValueError, ["sizes must be a sequence of ints", "8 (int)"]),
    (lambda: planning.read_stats(1), ValueError, ["path must be a path (a str or pathlib.Path)", "1 (int)"]),
    (lambda: planning.load_workload(1), ValueError, ["paths must be a path or a sequence of paths", "1 (int)"]),
    (lambda: planning.plan_for("stats.json", 3), ValueError, ["workload must be a planning.Workload", "(str)"]),
    (lambda: settings.parse({"VENDOR_GRAPH_SHADOW": 3}), TypeError, ["environ['VENDOR_GRAPH_SHADOW'] must be a str",
                                                                     "3 (int)"]),
    (lambda: settings.parse({"VENDOR_GRAPH_SHADOW": b"3"}), TypeError, ["environ['VENDOR_GRAPH_SHADOW']", "(bytes)"]),
    (lambda: settings.readings({"VENDOR_GRAPH_DEBUG": 1.0}), TypeError, ["environ['VENDOR_GRAPH_DEBUG']", "(float)"]),
    (lambda: settings.parse([("VENDOR_GRAPH_SHADOW", "1")]), TypeError, ["environ must be a mapping", "(list)"]),
    (lambda: capacity.resolve_capture_plan("cuda", 8, 8, None, current=_empty()), TypeError,
     ["default_sizes must be a sequence of ints", "8 (int)"]),
    (lambda: capacity.resolve_capture_plan("cuda", 8, [8], 4, current=_empty()), ValueError,
     ["cudagraph_capture_batch_sizes must be a sequence of ints", "4 (int)"]),
    (lambda: capacity.resolve_capture_plan(3, 8, [8], None, current=_empty()), TypeError, ["vendor must be a vendor "
                                                                                           "name"]),
    (lambda: capacity.resolve_capture_plan("cuda", 8, [8], None, current={}), TypeError, ["current must be a "
                                                                                         "vendor_graph.config.settings"]),
    (lambda: capacity.reservation("8", _empty()), TypeError, ["max_batches must be an int", "'8' (str)"]),
    # found by tests/fuzz/test_api_values.py
    (lambda: planning.fit_sizes({3: 1}, HUGE, 2), ValueError, ["max_batches an int of about 5001 digits is above "
                                                               "65536"]),
    (lambda: planning.padded_tokens({3: 1}, [70000]), ValueError, ["capture size 70000 is above 65536"]),
    (lambda: planning.search_cap(decimal.Decimal(5), 3), ValueError, ["candidates must be an int", "Decimal"]),
    (lambda: planning.search_cap(5, None), ValueError, ["max_graphs None is not a whole number"]),
    (lambda: settings.closest(3), TypeError, ["name must be a variable name (a str)", "3 (int)"]),
    (lambda: settings.unknown(3), TypeError, ["environ must be a mapping", "3 (int)"]),
]


@pytest.mark.parametrize("call,expected", ACCEPTED, ids=range(len(ACCEPTED)))
def test_accepted(call, expected):
    assert call() == expected


@pytest.mark.parametrize("call,error,words", REFUSED, ids=range(len(REFUSED)))
def test_refused_naming_the_argument(call, error, words):
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    for text in words:
        assert text in message, (text, message)
    assert not any(deep in message for deep in DEEP_ERRORS), message


def test_a_file_descriptor_is_never_read_as_a_stats_file(monkeypatch):
    """planning.load_workload([1]) took the int for a file descriptor, read the caller's stdout and closed it."""
    stdout = sys.stdout
    with pytest.raises(planning.PlanError, match=r"paths\[0\] must be a path"):
        planning.load_workload([1])
    assert sys.stdout is stdout and not sys.stdout.closed
    print("still open", file=io.StringIO())


@needs_numpy
def test_numpy_integers_and_arrays():
    import numpy as np

    sizes = np.array([1, 2, 4, 8])
    assert buckets.pad_to_bucket(sizes, np.int32(3)) == 4
    assert type(buckets.pad_to_bucket(sizes, 3)) is int
    assert buckets.pad_to_bucket(list(sizes), np.uint8(5)) == 8
    assert buckets.explicit_capture_sizes(np.array([4, 2]), np.int64(8)) == [2, 4, 8]
    assert buckets.cuda_capture_sizes(np.int16(5)) == [1, 2, 4, 5]
    assert ascend_capture_sizes(np.int64(20)) == [1, 2, 4, 8, 16, 20]
    assert planning.fit_sizes({np.int64(3): np.int64(5), 5: np.float32(2.5)}, np.int64(8), np.int32(2)) == [3, 8]
    assert planning.padded_tokens({3: 1}, np.array([4, 8])) == 1.0
    workload = planning.Workload("ascend", 8, (1, 8), {3: 1}, {3: 1}, num_layers=2)
    plan = planning.plan_for(workload, np.int64(3), np.array([2]), event_budget=np.int64(100))
    assert plan.capture_sizes == [2, 3, 8]
    plan = capacity.resolve_capture_plan("cuda", np.int64(8), np.array([1, 2, 8]), np.array([1, 2]), current=_empty())
    assert plan.sizes == (1, 2, 8) and all(type(s) is int for s in plan.sizes)
    for call, words in [
        (lambda: buckets.pad_to_bucket(np.array(3), 2), "capture_sizes must be a sequence of ints"),
        (lambda: buckets.explicit_capture_sizes(np.array([[1, 2]]), 8), "must be positive ints"),
        (lambda: buckets.pad_to_bucket(np.array([1.0, 2.0]), 2), "capture sizes must be ints"),
        (lambda: planning.padded_fraction(np.array([1, 2]), [4]), "weights must be a mapping"),
        (lambda: buckets.cuda_capture_sizes(np.float64(8)), "max_batches must be an int"),
    ]:
        with pytest.raises((TypeError, ValueError)) as info:
            call()
        assert words in str(info.value), str(info.value)
        assert not any(deep in str(info.value) for deep in DEEP_ERRORS)
