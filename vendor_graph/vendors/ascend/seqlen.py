"""Which seq-len update path each Ascend attention op gets, from what torch_npu really provides.

Ascend attention reads its KV lengths as host values that are frozen into a captured graph. After
every fill the captured tasks must be refreshed, by one of:

* ``graph-update``: capture with ``auto_dispatch_capture=True`` and call
  ``NPUGraph.update(cpu_update_input=[...])``; works only for the ops and argument spellings the
  installed generation intercepts (``releases.GENERATION_FACTS["Gx"]["update_ops"]``);
* ``task-update``: capture each attention inside a task group gated by an ``ExternalEvent``, and
  re-issue it between ``graph_task_update_begin/end`` on an update stream each step (G1 and later);
* ``none``: no graph API (G0), or nothing can reach the op: that graph runs eager.

The path is chosen per op from the generation actually present: a feature probe of the installed
module, checked against the table built from the real wheels (the probe wins when they disagree, and
says so). A version rule (``torch_npu >= 2.8.0.post1`` -> graph-update, docs/ascend.md) is only the
fallback for releases the table does not know. ``VENDOR_GRAPH_SEQLEN_UPDATE`` forces a path.
"""

from __future__ import annotations

import inspect
import logging
import threading
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from packaging.version import InvalidVersion, Version

from ...config import settings
from . import releases

logger = logging.getLogger("vendor_graph")

SEQLEN_UPDATE_ENV = settings.variable("seqlen_update")
GRAPH_UPDATE = "graph-update"
TASK_UPDATE = "task-update"
NO_UPDATE = "none"
PATHS = (GRAPH_UPDATE, TASK_UPDATE, NO_UPDATE)
# The version gate, kept only as the fallback for releases outside the table (docs/ascend.md).
FALLBACK_MIN_GRAPH_UPDATE = Version("2.8.0.post1")


@dataclass(frozen=True)
class AttentionOp:
    """How one Ascend attention op takes its host KV lengths."""

    name: str  # op name without overload, as torch_npu's dispatcher sees it
    key: str  # the update key (cpu_update_input dict key and argument name)
    position: int | None  # index among positional args, None when passed by keyword
    # Whether every overload writes into a caller-given output (else only ``.out`` does).
    writes_given_output: bool = False
    arity: int | None = None  # positional arguments in the call, to resolve rules like args[-2]


FIA = AttentionOp("npu_fused_infer_attention_score", "actual_seq_lengths_kv", None)
FIA_V2 = AttentionOp("npu_fused_infer_attention_score_v2", "actual_seq_kvlen", None)
PAGED_ATTENTION = AttentionOp("_npu_paged_attention", "context_lens", 7, writes_given_output=True, arity=9)
MLA = AttentionOp("npu_multi_head_latent_attention", "context_lens", 5)
PAGED_ATTENTION_MLA = AttentionOp("_npu_paged_attention_mla", "context_lens", 6, writes_given_output=True,
                                  arity=9)
ATTENTION_OPS = {op.name: op for op in (FIA, FIA_V2, PAGED_ATTENTION, MLA, PAGED_ATTENTION_MLA)}


def _same_position(index: int, op: AttentionOp) -> bool:
    if index < 0:
        return op.arity is not None and op.arity + index == op.position
    return index == op.position


def intercepted(facts: dict[str, Any], op: AttentionOp, overload: str) -> bool:
    """Whether ``NPUGraph``'s dispatcher records this call itself when capturing with auto dispatch."""
    return bool(facts.get("update")) and (op.name + overload) in facts.get("update_ops", {})


def path_for(facts: dict[str, Any], op: AttentionOp, overload: str = ".default") -> str:
    """The update path for ``op`` called as ``op.name + overload`` on a generation with ``facts``."""
    if not facts.get("graph_api"):
        return NO_UPDATE
    if facts.get("update"):
        rule = facts.get("update_ops", {}).get(op.name + overload)
        if rule is not None and not rule.get("should_handle"):
            if op.position is None:
                # Keyword spelling: the kwargs rule writes it ("existing keys" holds, since we always pass it).
                if rule["kwargs"] in ("any_key", "existing_keys_only"):
                    return GRAPH_UPDATE
            elif any(key == op.key and _same_position(index, op) for index, key in rule["args"]):
                return GRAPH_UPDATE
    if facts.get("task_group_api") and facts.get("external_event"):
        return TASK_UPDATE
    return NO_UPDATE


def _installed_torch_npu_version() -> str | None:
    for dist in ("torch_npu", "torch-npu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def seqlen_update_path(version: str | None = None) -> str:
    """The path for standard FIA decode on a torch_npu release (None: the installed one, read from
    package metadata without importing torch_npu). Unknown releases use the fallback version rule;
    malformed strings give ``"none"``, never an exception."""
    if version is None:
        version = _installed_torch_npu_version()
        if version is None:
            return NO_UPDATE
    try:
        facts = releases.facts_of(version)
    except (ValueError, TypeError):
        try:
            parsed = Version(str(version))
        except InvalidVersion:
            return NO_UPDATE
        return GRAPH_UPDATE if parsed >= FALLBACK_MIN_GRAPH_UPDATE else TASK_UPDATE
    return path_for(facts, FIA)


def forced_path() -> str | None:
    """The path ``VENDOR_GRAPH_SEQLEN_UPDATE`` forces in the current settings, or None for ``auto``."""
    value = settings.current().seqlen_update
    return None if value == "auto" else value


def probe_facts(npu_module: Any) -> dict[str, Any]:
    """The graph-API features the installed ``torch.npu`` module really has.

    Intercepted ops cannot be called to find out; they are read from the source text of the module
    that implements ``update()`` where it is available, else left to the table.
    """
    graph_cls = getattr(npu_module, "NPUGraph", None)
    graph_fn = getattr(npu_module, "graph", None)
    params: set[str] = set()
    if graph_fn is not None:
        try:
            params = set(inspect.signature(graph_fn.__init__ if inspect.isclass(graph_fn) else graph_fn).parameters)
        except (TypeError, ValueError):
            params = set()
    return {
        "graph_api": graph_cls is not None,
        "update": graph_cls is not None and hasattr(graph_cls, "update"),
        "auto_dispatch_capture": "auto_dispatch_capture" in params,
        "task_group_api": all(hasattr(npu_module, n) for n in (
            "graph_task_group_begin", "graph_task_group_end", "graph_task_update_begin", "graph_task_update_end")),
        "external_event": hasattr(npu_module, "ExternalEvent"),
    }


_PROBED_KEYS = ("graph_api", "update", "auto_dispatch_capture", "task_group_api", "external_event")


@dataclass(frozen=True)
class Capabilities:
    """What this process's torch_npu offers, and where that conclusion came from."""

    version: str | None
    generation: str | None
    facts: dict[str, Any]
    source: str  # "table", "probe (table says ...)", "probe (release not in table)"

    def path(self, op: AttentionOp, overload: str = ".default") -> str:
        forced = forced_path()
        if forced is not None:
            return forced
        return path_for(self.facts, op, overload)


def detect(npu_module: Any, version: str | None) -> Capabilities:
    """Probe ``npu_module`` (``torch.npu``), compare with the table row of ``version``; the probe wins."""
    probed = probe_facts(npu_module)
    table_gen = None
    try:
        table_gen = releases.generation_of(version) if version else None
    except ValueError:
        table_gen = None
    if table_gen is not None:
        table = releases.GENERATION_FACTS[table_gen]
        if all(table[k] == probed[k] for k in _PROBED_KEYS):
            return Capabilities(version, table_gen, dict(table), "table")
    # Disagreement: the oldest generation with the probed features supplies the op rules (it
    # intercepts the fewest ops, so no op is wrongly trusted to graph.update; the post-capture
    # check catches the rest). Unknown release: the fallback version rule decides whether the
    # newest matching generation's rules apply, as documented.
    matches = [g for g, f in releases.GENERATION_FACTS.items() if all(f[k] == probed[k] for k in _PROBED_KEYS)]
    generation = None
    if matches:
        generation = matches[0]
        if table_gen is None:
            try:
                newer = Version(str(version)) >= FALLBACK_MIN_GRAPH_UPDATE
            except InvalidVersion:
                newer = False
            generation = matches[-1] if newer else matches[0]
    facts = dict(releases.GENERATION_FACTS[generation]) if generation else {**probed, "update_ops": {}}
    if table_gen is None and generation is not None and not newer:
        facts["update_ops"] = {}
    source = f"probe (table says {table_gen})" if table_gen else "probe (release not in table)"
    logger.warning("vendor_graph.ascend: torch_npu %s: features %s; using %s rules (%s)",
                   version, probed, generation or "no generation's", source)
    return Capabilities(version, generation, facts, source)


class UpdateOwner:
    """The one issuer of seq-len updates in a process: every runner (main and draft model, several engines,
    any thread) refreshes its graphs' tasks inside ``with UPDATES:``, one refresh at a time.

    torch_npu keeps one open task update per process on the device side: with two threads updating at once,
    ``graph_task_update_begin`` fails (docs/ascend.md). ``NPUGraph.update`` re-issues through the same calls.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.refreshes = 0

    def __enter__(self) -> None:
        self._lock.acquire()
        self.refreshes += 1

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


UPDATES = UpdateOwner()


# -- the release -> path table (``vendor-graph paths``, docs/ascend.md, ``doctor``) --------------------------


def seqlen_ops() -> list[tuple[str, AttentionOp, str]]:
    """(column name, attention op, overload) of the seq-len path table (and of ``doctor``)."""
    return [("FIA `.default`", FIA, ".default"), ("FIA `.out`", FIA, ".out"), ("FIA v2 `.out`", FIA_V2, ".out"),
            ("paged attention", PAGED_ATTENTION, ".default"), ("MLA `.out`", MLA, ".out"),
            ("paged attention MLA", PAGED_ATTENTION_MLA, ".default")]


def seqlen_path_table() -> str:
    """Markdown: every torch_npu release and pre-release of the table -> the seq-len update path per attention op."""
    ops = seqlen_ops()
    lines = ["| torch_npu | generation | " + " | ".join(name for name, _, _ in ops) + " |",
             "|---|---|" + "---|" * len(ops)]
    rows = sorted((*releases.RELEASES, *releases.PRERELEASES), key=lambda r: (r.generation, Version(r.version)))
    for release in rows:
        facts = releases.GENERATION_FACTS[release.generation]
        lines.append(f"| {release.version} | {release.generation} | "
                     + " | ".join(path_for(facts, op, overload) for _, op, overload in ops) + " |")
    return "\n".join(lines)
