"""Capture sizes fitted to a recorded workload: the sizes that pad the fewest tokens.

Graph mode captures one graph per capture size; a decode step of real batch ``b`` replays the smallest
captured size ``s >= b`` and computes ``s - b`` padded rows per query token. Given how many decode steps
ran at each real batch size (a :class:`~vendor_graph.sizing.workload.Workload` read from stats files),
:func:`fit_sizes` chooses at most ``max_graphs`` sizes that minimise those padded tokens, exactly, and
:func:`plan_for` compares them with the sizes the recorded run captured. ``vendor-graph plan --from-stats``
prints the plan; its ``--json`` output is a ``VENDOR_GRAPH_CAPTURE_SIZES`` file.

The reading names (``read_stats``, ``load_workload``, ``Workload``, ``STATS_FORMAT``, ``PlanError``) are
importable from here too, where the CLI, the doctor and the capacity check take them with the plan.

Pure Python: neither torch nor lmdeploy is imported here. The Ascend event budget in :func:`plan_for`
reads :mod:`vendor_graph.vendors.ascend.limits`, whose package imports torch; where that import fails the plan
goes uncapped, with a note saying so.
"""

from __future__ import annotations

import bisect
import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from ..config import values as _values
from .buckets import MAX_BATCHES_LIMIT
from .workload import STATS_FORMAT, STATS_VENDORS, PlanError, Workload, load_workload, read_stats

# Steps of the exact fit: one per candidate size per graph (a few seconds of pure Python at this bound). The
# planner caps the graphs to stay within it, with a note; fit_sizes refuses more.
SEARCH_LIMIT = 2_000_000


# -- the optimiser -----------------------------------------------------------------------------------------


def _size(value: Any, what: str) -> int:
    if not _values.is_index(value):
        raise PlanError(f"{what} {_values.brief(value)} is not a whole number; batch sizes are whole numbers of 1 or "
                        f"more")
    value = _values.whole(what, value, PlanError)
    if value < 1:
        raise PlanError(f"{what} {value} is not positive; batch sizes are whole numbers of 1 or more")
    if value > MAX_BATCHES_LIMIT:
        raise PlanError(f"{what} {_values.brief(value)} is above {MAX_BATCHES_LIMIT}, vendor_graph's bound on "
                        f"max_batch_size; batch sizes are whole numbers from 1 to {MAX_BATCHES_LIMIT}")
    return value


def _weights(weights: Mapping[Any, Any]) -> tuple[dict[int, int], int]:
    """``weights`` as whole numbers over a common denominator, so that every sum and comparison is exact."""
    if not isinstance(weights, Mapping):
        raise PlanError(f"weights must be a mapping of batch size -> tokens (a dict), got {_values.show(weights)}")
    exact: dict[int, Fraction] = {}
    for batch, weight in weights.items():
        batch = _size(batch, "batch")
        if not _values.is_index(weight) and (isinstance(weight, bool) or not isinstance(weight, numbers.Real)
                                             or not math.isfinite(weight)):
            raise PlanError(f"batch {batch}: weight {_values.brief(weight)} is not a finite number (an int or a "
                            f"float); give token counts (decode steps x query length)")
        if _values.is_index(weight):
            weight = _values.whole("weight", weight)
        if weight < 0:
            raise PlanError(f"batch {batch}: weight {weight} is negative; give token counts (decode steps x "
                            f"query length), 0 or more")
        exact[batch] = _values.count(f"batch {batch}: weight", weight, PlanError)
    denominator = math.lcm(*(w.denominator for w in exact.values())) if exact else 1
    return {b: int(w * denominator) for b, w in exact.items()}, denominator


def _check_graphs(max_graphs: Any) -> int:
    if not _values.is_index(max_graphs):
        raise PlanError(f"max_graphs {_values.brief(max_graphs)} is not a whole number (an int); give 1 or more")
    max_graphs = _values.whole("max_graphs", max_graphs, PlanError)
    if max_graphs < 1:
        raise PlanError(f"max_graphs {max_graphs}: at least one graph (max_batches) is captured; give 1 or more")
    return int(max_graphs)


def fit_sizes(weights: Mapping[int, int | float], max_batches: int, max_graphs: int,
              required: Iterable[int] = ()) -> list[int]:
    """The capture sizes, at most ``max_graphs``, that pad the fewest tokens for ``weights``.

    ``weights[b]``: the tokens decoded at real batch ``b`` (steps x query length). The sizes always hold
    ``max_batches`` and every ``required`` size, and minimise ``sum(weights[b] * (bucket(b) - b))``; among
    plans that tie, the one with fewer sizes, then the lexicographically smaller one.

    Exact: a dynamic programme over the candidate sizes (batches of positive weight, the required sizes,
    ``max_batches``). An optimum exists among them: a size that is none of these serves only batches below
    it; lowered to the largest positive-weight batch it serves it pads strictly less, and one that serves
    none can be dropped without changing the padding.
    """
    exact, _ = _weights(weights)
    max_batches = _size(max_batches, "max_batches")
    max_graphs = _check_graphs(max_graphs)
    required = sorted({_size(s, "required size") for s in _values.items("required", required, PlanError)})
    if not exact or sum(exact.values()) == 0:
        raise PlanError("the histogram holds no decode steps (total weight 0); record a workload that decodes "
                        "(run it with VENDOR_GRAPH_STATS_FILE set) and plan from that")
    above = sorted(b for b in exact if b > max_batches)
    if above:
        raise PlanError(f"batch {above[-1]} is above max_batches {max_batches}: the stats were recorded with a "
                        f"larger max_batch_size; plan with max_batches {above[-1]} or more, or record the workload "
                        f"again at max_batch_size {max_batches}")
    too_big = [s for s in required if s > max_batches]
    if too_big:
        raise PlanError(f"required size {too_big[-1]} is above max_batches {max_batches}, so it would never be "
                        f"replayed; give required sizes <= {max_batches}")
    fixed = sorted(set(required) | {max_batches})
    if len(fixed) > max_graphs:
        raise PlanError(f"{len(fixed)} sizes are required ({', '.join(map(str, fixed))}, max_batches included) but "
                        f"max_graphs is {max_graphs}; allow {len(fixed)} or more graphs, or require fewer sizes")
    candidates = _candidates(exact, fixed)
    if max_graphs >= len(candidates):  # a graph for every candidate: no padding, and no fewer sizes pad none
        return candidates
    work = len(candidates) * max_graphs
    if work > SEARCH_LIMIT:
        raise PlanError(f"an exact fit of {len(candidates)} distinct batch sizes into at most {max_graphs} "
                        f"graphs takes {work} search steps, above vendor_graph's bound of {SEARCH_LIMIT} (a few "
                        f"seconds); allow at most {max(1, SEARCH_LIMIT // len(candidates))} graphs, or "
                        f"{len(candidates)} or more (a graph for every batch size)")
    return _fit(exact, fixed, max_graphs)


def _candidates(weights: Mapping[int, int], fixed: Iterable[int]) -> list[int]:
    """The sizes an optimal plan is made of (see :func:`fit_sizes`): batches of positive weight, and the fixed ones."""
    return sorted({b for b, w in weights.items() if w > 0} | set(fixed))


def search_cap(candidates: int, max_graphs: int) -> int:
    """The most graphs the exact fit of ``candidates`` distinct sizes may search within :data:`SEARCH_LIMIT` steps
    (``max_graphs`` itself where it is within the bound, or covers every candidate, which needs no search)."""
    candidates = _values.whole("candidates", candidates, PlanError)
    max_graphs = _check_graphs(max_graphs)
    if max_graphs >= candidates or candidates * max_graphs <= SEARCH_LIMIT:
        return max_graphs
    return max(1, SEARCH_LIMIT // candidates)


def _fit(weights: Mapping[int, int], fixed: list[int], max_graphs: int) -> list[int]:
    # Node 0 is a virtual start below every size; node t (1..K) is candidate t-1. layers[k][t]: the fewest
    # padded tokens above node t with k more sizes, the last of them max_batches (None: impossible).
    # Rebuilding the plan from the start node, taking the smallest next size that keeps the optimum,
    # gives the lexicographically smallest plan.
    candidates = _candidates(weights, fixed)
    count = len(candidates)
    is_fixed = [False] + [c in set(fixed) for c in candidates]
    size = [0] + candidates
    tokens, mass = [0] * (count + 1), [0] * (count + 1)
    for t, c in enumerate(candidates, 1):
        w = weights.get(c, 0)
        tokens[t] = tokens[t - 1] + w
        mass[t] = mass[t - 1] + w * c

    def cost(i: int, j: int) -> int:
        return size[j] * (tokens[j] - tokens[i]) - (mass[j] - mass[i])

    layers: list[list[Any]] = [[None] * count + [0]]
    for _ in range(min(max_graphs, count)):
        layers.append(_layer(layers[-1], size, tokens, mass, is_fixed))
        if layers[-1][0] == 0:
            break
    best = min(v for v in (layer[0] for layer in layers[1:]) if v is not None)
    k = next(k for k in range(1, len(layers)) if layers[k][0] == best)
    plan, i = [], 0
    while k:
        j = i + 1
        while not (layers[k - 1][j] is not None and cost(i, j) + layers[k - 1][j] == layers[k][i]):
            j += 1
        plan.append(size[j])
        i, k = j, k - 1
    return plan


def _layer(previous: list[Any], size: list[int], tokens: list[Any], mass: list[Any],
           is_fixed: list[bool]) -> list[Any]:
    """One more size: ``out[i] = min over j of cost(i, j) + previous[j]``, for j above i up to the next
    fixed size, by a monotone lower envelope of the lines ``-size[j] * tokens[i] + intercept_j``."""
    count = len(size) - 1
    out: list[Any] = [None] * (count + 1)
    slopes: list[int] = []
    intercepts: list[Any] = []
    head = 0
    for i in range(count - 1, -1, -1):
        j = i + 1
        if is_fixed[j]:  # nothing above a fixed size may serve batches at or below it
            slopes.clear()
            intercepts.clear()
            head = 0
        if previous[j] is not None:
            a, b = -size[j], size[j] * tokens[j] - mass[j] + previous[j]
            while len(slopes) - head >= 2 and (
                    (b - intercepts[-2]) * (slopes[-2] - slopes[-1])
                    >= (intercepts[-1] - intercepts[-2]) * (slopes[-2] - a)):
                slopes.pop()
                intercepts.pop()
            slopes.append(a)
            intercepts.append(b)
        if len(slopes) == head:
            continue
        x = tokens[i]
        while len(slopes) - head >= 2 and (
                slopes[head + 1] * x + intercepts[head + 1] <= slopes[head] * x + intercepts[head]):
            head += 1
        out[i] = slopes[head] * x + intercepts[head] + mass[i]
    return out


def _sized(sizes: Iterable[int]) -> list[int]:
    return sorted({_size(s, "capture size") for s in _values.items("sizes", sizes, PlanError)})


def _bucket(sizes: list[int], batch: int) -> int:
    at = bisect.bisect_left(sizes, batch)
    if at == len(sizes):
        largest = f"the largest capture size {sizes[-1]}" if sizes else "every capture size (none given)"
        raise PlanError(f"batch {batch} is above {largest}, so it runs eager; include a size of {batch} or more")
    return sizes[at]


def _padding(weights: Mapping[int, int | float], sizes: Iterable[int]) -> tuple[Fraction, Fraction]:
    (exact, denominator), sizes = _weights(weights), _sized(sizes)
    padded = graph = 0
    for batch, weight in exact.items():
        bucket = _bucket(sizes, batch)
        padded += weight * (bucket - batch)
        graph += weight * bucket
    return Fraction(padded, denominator), Fraction(graph, denominator)


def padded_tokens(weights: Mapping[int, int | float], sizes: Iterable[int]) -> float:
    """Padded tokens ``sum(weights[b] * (bucket(b) - b))`` when ``sizes`` are captured."""
    return float(_padding(weights, sizes)[0])


def padded_fraction(weights: Mapping[int, int | float], sizes: Iterable[int]) -> float:
    """Padded tokens over graph tokens (``sum(weights[b] * bucket(b))``); 0.0 when nothing was decoded."""
    padded, graph = _padding(weights, sizes)
    return float(padded / graph) if graph else 0.0


# -- plans -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Fitted capture sizes against the recorded ones."""

    capture_sizes: list[int]
    padded_fraction_before: float
    padded_fraction_after: float
    padded_tokens_before: float
    padded_tokens_after: float
    max_graphs: int  # the limit the fit ran under (the Ascend event budget may lower what was asked)
    notes: tuple[str, ...] = ()


def _ascend_cap(workload: Workload, event_budget: int | None | str) -> tuple[int | None, str | None]:
    """The graphs the Ascend ExternalEvent budget allows (None: no limit), and a note."""
    if event_budget != "env" and event_budget is not None and (
            isinstance(event_budget, bool) or not isinstance(event_budget, int) or event_budget < 0):
        raise PlanError(f"event_budget {event_budget!r}: give a number of ExternalEvents (0 or more), None for no "
                        f"limit, or \"env\"")
    try:
        from ..vendors.ascend import limits
    except ImportError as exc:
        return None, (f"the Ascend event budget was not applied: vendor_graph.ascend does not import here ({exc}); "
                      f"plan where it imports (torch installed) to cap the graphs by it")
    budget = limits.event_budget() if event_budget == "env" else event_budget
    if budget is None:
        return None, None
    if not workload.num_layers:
        return None, (f"the stats do not record num_layers, so the Ascend event budget ({budget} ExternalEvents) "
                      f"was not applied; check the plan against it")
    per_size = limits.events_per_graph(workload.num_layers) * len(workload.query_lens)
    graphs = budget // per_size
    if graphs < 1:
        raise PlanError(f"the Ascend event budget of {budget} ExternalEvents ({limits.EVENT_BUDGET_ENV}) does not "
                        f"fit even one size: each needs {per_size} ({workload.num_layers} layers x "
                        f"{len(workload.query_lens)} query lengths); raise {limits.EVENT_BUDGET_ENV} to "
                        f"{per_size} or more if the device has the event resources")
    lens = f" x {len(workload.query_lens)} query lengths" if len(workload.query_lens) > 1 else ""
    plural = "s" if graphs != 1 else ""
    return graphs, (f"Ascend event budget allows at most {graphs} graph{plural} for {workload.num_layers} layers "
                    f"({per_size} ExternalEvents per size: {workload.num_layers} layers{lens}; budget {budget}, "
                    f"{limits.EVENT_BUDGET_ENV})")


def plan_for(workload: Workload, max_graphs: int, required: Iterable[int] = (), *,
             event_budget: int | None | str = "env") -> Plan:
    """Fit at most ``max_graphs`` sizes (holding ``required``) to ``workload`` and compare with its recorded sizes.

    On Ascend the ExternalEvent budget caps ``max_graphs`` (``event_budget``: ``"env"`` reads
    ``VENDOR_GRAPH_NPU_EVENT_BUDGET``; None: no limit; or a number of events).
    """
    if not isinstance(workload, Workload):
        raise PlanError(f"workload must be a planning.Workload (load_workload() gives one), got "
                        f"{_values.show(workload)}")
    files = ", ".join(workload.files) or "the workload"
    if not workload.decode_steps:
        raise PlanError(f"{files}: no decode steps recorded; run the workload longer (or until it decodes) with "
                        f"VENDOR_GRAPH_STATS_FILE set, then plan from the new file")
    max_graphs = _check_graphs(max_graphs)
    required = _values.items("required", required, PlanError)
    if not (event_budget is None or isinstance(event_budget, (str, bool, int))):
        event_budget = _values.whole("event_budget", event_budget, PlanError)
    recorded = sorted(workload.capture_sizes)
    seen = max(workload.steps)
    if not recorded or seen > recorded[-1]:
        raise PlanError(f"{files}: batch {seen} is above every recorded capture size {recorded} (those steps ran "
                        f"eager), so there is no before figure; record the workload with capture sizes up to "
                        f"max_batches {workload.max_batches}")
    required = sorted({_size(s, "required size") for s in required})
    notes = []
    if workload.vendor == "ascend":
        cap, note = _ascend_cap(workload, event_budget)
        if note:
            notes.append(note)
        if cap is not None and cap < max_graphs:
            max_graphs = cap
            fixed = sorted({workload.max_batches, *required})
            if len(fixed) > cap:
                raise PlanError(f"{note}, fewer than the {len(fixed)} sizes required ({', '.join(map(str, fixed))}, "
                                f"max_batches included); require fewer sizes, or raise the budget if the device has "
                                f"the event resources")
    candidates = len(_candidates(workload.weights, [*required, workload.max_batches]))
    searchable = search_cap(candidates, max_graphs)
    if searchable < max_graphs:
        fixed = sorted({workload.max_batches, *required})
        if len(fixed) > searchable:
            raise PlanError(f"{files}: an exact fit of {candidates} distinct batch sizes holding {len(fixed)} "
                            f"required sizes would search more than vendor_graph's bound of {SEARCH_LIMIT} steps (a "
                            f"few seconds); require fewer sizes, or allow {candidates} graphs or more (a graph for "
                            f"every batch size)")
        notes.append(f"at most {searchable} graphs fitted, not {max_graphs}: an exact fit of {candidates} distinct "
                     f"batch sizes searches {candidates} steps per graph, and vendor_graph bounds the search at "
                     f"{SEARCH_LIMIT} steps (a few seconds); allow {candidates} graphs or more for a graph per batch "
                     f"size")
        max_graphs = searchable
    sizes = fit_sizes(workload.weights, workload.max_batches, max_graphs, required)
    return Plan(capture_sizes=sizes,
                padded_fraction_before=padded_fraction(workload.weights, recorded),
                padded_fraction_after=padded_fraction(workload.weights, sizes),
                padded_tokens_before=padded_tokens(workload.weights, recorded),
                padded_tokens_after=padded_tokens(workload.weights, sizes),
                max_graphs=max_graphs, notes=tuple(notes))


__all__ = ["SEARCH_LIMIT", "STATS_FORMAT", "STATS_VENDORS", "Plan", "PlanError", "Workload", "fit_sizes",
           "load_workload", "padded_fraction", "padded_tokens", "plan_for", "read_stats", "search_cap"]
