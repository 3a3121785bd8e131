"""Generated Python values (numpy integers and arrays, Decimals, Fractions, floats, bools, huge ints, strings,
mappings) against every public function of the bucket, planning, capacity and settings modules: each returns (ints
as Python ints) or raises TypeError/ValueError naming what it wanted, never a message from deep inside."""

from __future__ import annotations

import decimal
import inspect

import pytest
from fuzz_harness import BOUND, FUZZ, bounded
from hypothesis import given
from hypothesis import strategies as st

from vendor_graph.config import settings
from vendor_graph.config import values as _values
from vendor_graph.sizing import buckets, capacity, planning, workload

np = pytest.importorskip("numpy")

DEEP = ("truth value of an array", "too large to convert", "has no attribute", "Exceeds the limit", "is not iterable",
        "is not subscriptable", "unhashable type", "not supported between instances",
        "should be a string or a Rational", "only integer scalar arrays", "cannot be interpreted as an integer",
        "invalid literal for int()", "object is not callable", "takes no arguments", "unexpected keyword")

SMALL = st.integers(-3, 300)


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:  # an array, a signaling-NaN Decimal
        return False
    return True


def _safe(args) -> str:
    """``args`` for an assertion message (a huge int's repr would raise)."""
    return ", ".join(_values.brief(a) for a in args)
INT_LIKE = st.one_of(
    SMALL, st.sampled_from([0, 65536, 65537, 2**63, -(2**63), 10**400, 10**5000]),
    st.integers(1, 300).map(np.int64), st.integers(1, 300).map(np.int32), st.integers(0, 255).map(np.uint8),
    st.integers(-5, 5).map(np.int16),
)
BAD_SCALARS = st.one_of(
    st.floats(), st.decimals(allow_nan=True).map(decimal.Decimal), st.fractions(), st.booleans(), st.none(),
    st.text(max_size=4), st.binary(max_size=3), st.complex_numbers(max_magnitude=10),
    st.sampled_from([np.float64(2.0), np.float32(2.5), np.bool_(True), np.array(3), np.array([[1, 2]]),
                     np.array([], dtype=np.int64), np.nan]),
)
SCALARS = st.one_of(INT_LIKE, INT_LIKE, BAD_SCALARS)
SEQUENCES = st.one_of(
    st.lists(INT_LIKE, max_size=6), st.lists(INT_LIKE, max_size=6).map(tuple),
    st.tuples(st.integers(-2, 40), st.integers(-2, 300), st.integers(1, 9)).map(lambda t: range(*t)),
    st.lists(st.integers(1, 300), max_size=6).map(lambda v: np.array(v, dtype=np.int64)),
    st.lists(st.integers(1, 300), min_size=1, max_size=6).map(lambda v: np.array(sorted(set(v)), dtype=np.int32)),
    st.lists(st.floats(1, 300), max_size=4).map(np.array),
    st.lists(SCALARS, max_size=4), st.sets(st.integers(1, 50), max_size=4), st.frozensets(SMALL, max_size=3),
)
ANY = st.one_of(SCALARS, SEQUENCES, st.dictionaries(st.integers(1, 50), SMALL, max_size=3))
WEIGHTS = st.one_of(
    st.dictionaries(st.one_of(st.integers(1, 64), st.integers(1, 64).map(np.int64)),
                    st.one_of(st.integers(0, 10**6), st.floats(0, 1e6), st.integers(0, 99).map(np.int64),
                              st.floats(0, 99).map(np.float32)), min_size=1, max_size=6),
    st.dictionaries(st.one_of(st.integers(1, 64), BAD_SCALARS.filter(_hashable)),
                    SCALARS, max_size=4),
    ANY,
)
VENDOR = st.one_of(st.sampled_from(["ascend", "camb", "maca", "cuda"]), ANY)


def _workloads():
    good = st.builds(planning.Workload, vendor=st.sampled_from(["ascend", "cuda"]), max_batches=st.just(64),
                     capture_sizes=st.just((1, 8, 64)), steps=st.just({3: 5, 20: 2}), weights=st.just({3: 5, 20: 2}),
                     num_layers=st.integers(0, 4))
    return st.one_of(good, ANY)


# each public function: how to call it with generated arguments
CALLS = {
    buckets.cuda_capture_sizes: st.tuples(ANY),
    buckets.explicit_capture_sizes: st.tuples(ANY, ANY),
    buckets.capture_sizes: st.tuples(st.just(buckets.cuda_capture_sizes), ANY, st.one_of(st.none(), ANY)),
    buckets.check_batch: st.tuples(st.just("batch"), ANY),
    buckets.check_max_batches: st.tuples(ANY),
    buckets.pad_to_bucket: st.tuples(ANY, ANY),
    buckets.ascend_bucket: st.tuples(ANY),
    buckets.ascend_capture_sizes: st.tuples(ANY),
    planning.fit_sizes: st.tuples(WEIGHTS, ANY, ANY, ANY),
    planning.padded_tokens: st.tuples(WEIGHTS, ANY),
    planning.padded_fraction: st.tuples(WEIGHTS, ANY),
    planning.search_cap: st.tuples(ANY, ANY),
    planning.plan_for: st.tuples(_workloads(), ANY, st.one_of(st.just(()), ANY)),
    planning.read_stats: st.tuples(st.one_of(ANY, st.just("/no/such/file.json"))),
    planning.load_workload: st.tuples(st.one_of(ANY, st.just(["/no/such/file.json"]))),
    capacity.resolve_capture_plan: st.tuples(VENDOR, ANY, ANY, st.one_of(st.none(), ANY)),
    capacity.reservation: st.tuples(ANY),
    settings.parse: st.tuples(st.one_of(ANY, st.dictionaries(st.sampled_from(sorted(settings.SETTINGS)), ANY,
                                                             max_size=3))),
    settings.closest: st.tuples(st.one_of(st.sampled_from(["VENDOR_GRAPH_SHADOWS", "SHADOW", ""]), ANY)),
    settings.unknown: st.tuples(st.one_of(ANY, st.dictionaries(st.sampled_from(["VENDOR_GRAPH_SHADOWS", "PATH"]),
                                                               ANY, max_size=2))),
    settings.readings: st.tuples(st.dictionaries(st.sampled_from(sorted(settings.SETTINGS)), ANY, max_size=3)),
}
# Public functions not fuzzed here, and why: they take lmdeploy's objects or no argument a user picks.
NOT_FUZZED = {
    "capacity": {"planned_blocks"},
    # the per-rank names of a stats file whose path the settings parser (fuzzed) already accepted
    "workload": {"rank_path", "stats_files"},
    # warn_unknown: unknown()'s names, logged once per process; unknown_message: the text for one of them
    "settings": {"clear", "current", "declared", "load", "variable", "warn_unknown", "unknown_message",
                 # the declared names (no argument), and one declaration by a name taken from the environment's keys
                 "known", "declared_elsewhere", "declaration"},
}


def test_every_public_function_is_fuzzed():
    for module in (buckets, workload, planning, capacity, settings):
        short = module.__name__.rsplit(".", 1)[-1]
        public = {name for name in module.__all__ if inspect.isfunction(getattr(module, name))
                  and getattr(module, name).__module__ == module.__name__}  # a re-export counts in its own module
        covered = {f.__name__ for f in CALLS if f.__module__ == module.__name__}
        missing = public - covered - NOT_FUZZED.get(short, set())
        assert not missing, f"{module.__name__}: give {sorted(missing)} a line in CALLS (or NOT_FUZZED, saying why)"


def _ints_are_ints(value) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_ints_are_ints(v) for v in value)
    return not isinstance(value, (np.integer, np.ndarray))


@pytest.mark.parametrize("function", list(CALLS), ids=[f"{f.__module__}.{f.__name__}" for f in CALLS])
@FUZZ
@given(data=st.data())
def test_public_functions_accept_or_refuse_by_name(function, data):
    args = data.draw(CALLS[function], label="args")
    kwargs = {"current": settings.parse({})} if function in (capacity.resolve_capture_plan,
                                                             capacity.reservation) else {}
    value, seconds = bounded(function, *args, **kwargs)
    assert seconds < BOUND, (function.__name__, _safe(args), seconds)
    if isinstance(value, BaseException):
        assert isinstance(value, (TypeError, ValueError)), (function.__name__, _safe(args), _values.brief(value))
        message = str(value)
        assert not any(deep in message for deep in DEEP), (function.__name__, _safe(args), message)
        return
    assert _ints_are_ints(value), (function.__name__, _safe(args), _values.brief(value))
