"""torch_npu releases and their graph-API generations, without importing torch_npu.

The graph API of torch_npu (``NPUGraph``, ``NPUGraph.update``, the task-group
functions) follows Huawei's release trains, not the version number: e.g.
2.7.1.post11 has the newest API while 2.8.0 is a generation behind
2.8.0.post2.  So no ``__version__ >= X`` gate is right for every wheel.  This
module maps the torch_npu releases on PyPI, and every pre-release there, to its
generation (G0 … G5) and records what each generation's graph API offers.  A
pre-release is a snapshot of an earlier train, not of the release it precedes:
2.10.0rc2 is G3a while 2.10.0 is G3b, so each has its own row, read from its own
wheel.  The facts were read from the wheels by
``tools/torch_npu_manifest.py`` (see ``sim/vendor_graph_sim/data/torch_npu_manifests/``); runtime feature
detection remains the primary signal, this table the documented fallback.

Pure Python: imports neither torch nor torch_npu.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

GENERATIONS: tuple[str, ...] = ("G0", "G1", "G2a", "G2b", "G2c", "G3a", "G3b", "G4", "G5")


class Release(NamedTuple):
    version: str  # the PyPI version, = torch_npu.__version__ (some pre-releases spell theirs 2.12.0.rc1)
    generation: str
    build_date: str | None  # release train: zip date of torch_npu/version.py
    source: str  # "manifest" (read from the wheel) or "research" (from torch_npu's source and notes, no wheel)


# --------------------------------------------------------------------------
# What each generation offers.  The keys and values are exactly what
# tools/torch_npu_manifest.py's facts_from_manifest() derives from a manifest;
# the tool classifies a wheel by finding the one generation whose facts match.
#
# update_ops maps each op name NPUGraph.update() intercepts at capture
# (``func.__name__`` in __torch_dispatch__) to:
#   recorded_as:   the op stored in the record (bare/.default calls are
#                  re-issued as .out);
#   kwargs:        "any_key": every key of the update dict is written into the
#                  recorded kwargs; "existing_keys_only": only keys that were
#                  in the kwargs at capture (non-None keyword arguments);
#                  "any_key if len(args) < 2": only when the op was captured
#                  with fewer than 2 positional args;
#   args:          (index, key): args[index] = update_input[key];
#   should_handle: a hook may decline the op at capture (FA3: CANN >= 9.1.0
#                  and layout != BNSD), then it is not recorded at all.

_FIA = "npu_fused_infer_attention_score"
_FIA2 = "npu_fused_infer_attention_score_v2"
_PA = "_npu_paged_attention"
_MLA = "npu_multi_head_latent_attention"
_FA3 = "npu_fusion_attention_v3"
_FA3_GRAD = "npu_fusion_attention_grad_v3"
_ALL = ("", ".default", ".out")
_ANY = "any_key"
_EXISTING = "existing_keys_only"


def _family(
    op: str,
    overloads: tuple[str, ...],
    kwargs: str,
    args: tuple[tuple[int, str], ...] = (),
    *,
    swap_to_out: bool = True,
    should_handle: bool = False,
) -> dict[str, dict[str, Any]]:
    return {
        op + overload: {
            "recorded_as": f"{op}.out" if swap_to_out else op + overload,
            "kwargs": kwargs,
            "args": args,
            "should_handle": should_handle,
        }
        for overload in overloads
    }


_G3_OPS = {
    **_family(_FIA, _ALL, _EXISTING, ((6, "actual_seq_lengths_kv"),)),
    **_family(_FIA2, _ALL, _EXISTING, ((8, "actual_seq_kvlen"),)),
    **_family(_PA, (".default",), _EXISTING, ((7, "context_lens"),), swap_to_out=False),
    **_family(_MLA, (".out",), _EXISTING, ((5, "context_lens"),), swap_to_out=False),
}
_G4_OPS = {
    **_G3_OPS,
    **_family(_FIA, _ALL, _EXISTING, ((5, "actual_seq_lengths"), (6, "actual_seq_lengths_kv"))),
    **_family(_FIA2, _ALL, _EXISTING, ((7, "actual_seq_qlen"), (8, "actual_seq_kvlen"))),
    **_family(_FA3, _ALL, _EXISTING, ((14, "actual_seq_qlen"), (15, "actual_seq_kvlen")), should_handle=True),
    **_family(
        _FA3_GRAD, _ALL, _EXISTING, ((21, "actual_seq_qlen"), (22, "actual_seq_kvlen")), should_handle=True
    ),
}

_NO_GRAPH: dict[str, Any] = {
    "graph_api": False,  # torch_npu.npu.NPUGraph exists
    "update": False,  # NPUGraph.update(cpu_update_input) exists
    "auto_dispatch_capture": False,  # torch.npu.graph(..., auto_dispatch_capture=...)
    "task_group_api": False,  # graph_task_group_begin/end, graph_task_update_begin/end
    "external_event": False,  # torch.npu.ExternalEvent
    "external_stream": False,  # torch.npu.ExternalStream
    "handler_registry": False,  # register_npu_graph_handler / NpuGraphOpHandler
    "debug_dump": False,  # Python NPUGraph.debug_dump(debug_path)
    "update_length_check": None,  # len(cpu_update_input) vs records
    "positional_key_guarded": None,  # False: a missing positional key raises KeyError
    "update_ops": {},
}
_G1 = {**_NO_GRAPH, "graph_api": True, "task_group_api": True, "external_event": True}
_G2 = {
    **_G1,
    "update": True,
    "auto_dispatch_capture": True,
    "update_length_check": "compares_records_with_itself",  # never fires
}
_G3B = {
    **_G2,
    "debug_dump": True,
    "handler_registry": True,
    "update_length_check": "raises_on_mismatch",
    "positional_key_guarded": True,
    "update_ops": _G3_OPS,
}

GENERATION_FACTS: dict[str, dict[str, Any]] = {
    "G0": _NO_GRAPH,
    "G1": _G1,
    "G2a": {**_G2, "update_ops": _family(_FIA, ("", ".out"), _ANY)},
    "G2b": {**_G2, "update_ops": _family(_FIA, _ALL, _ANY)},
    "G2c": {
        **_G2,
        "positional_key_guarded": False,
        "update_ops": {
            **_family(_FIA, _ALL, _ANY),
            **_family(
                _PA, ("", ".default"), "any_key if len(args) < 2", ((-2, "context_lens"),), swap_to_out=False
            ),
        },
    },
    "G3a": {**_G2, "debug_dump": True, "positional_key_guarded": False, "update_ops": _G3_OPS},
    "G3b": _G3B,
    "G4": {**_G3B, "update_ops": _G4_OPS},
    "G5": {**_G3B, "update_ops": _G4_OPS, "external_stream": True},
}

# One line per generation, for people (facts above are what code should use).
GENERATION_NOTES: dict[str, str] = {
    "G0": "no graph API at all (2024-10, 2025-01 trains)",
    "G1": "NPUGraph, graph(), task-group API, ExternalEvent; no update() (2025-04-24)",
    "G2a": "update() + auto_dispatch_capture; FIA v1 bare/.out only, any kwargs key (2025-07-22)",
    "G2b": "as G2a, FIA v1 .default also intercepted (2025-10-23)",
    "G2c": "as G2b, plus paged attention with args[-2] <- context_lens (2025-10-23, 2.6.0.post3)",
    "G3a": "FIA v1/v2, PA, MLA; recorded kwargs only; unguarded args[i] table (2026-01-13)",
    "G3b": "as G3a via the op-handler registry; guarded; length check fixed (2026-04..06)",
    "G4": "adds actual_seq_lengths / actual_seq_qlen positions and FA3 fwd/bwd (2026-07, 2026-08)",
    "G5": "as G4, plus ExternalStream (2026-10-15)",
}

# BEGIN GENERATED TABLE (tools/torch_npu_manifest.py --write-table; do not edit)
# source 'manifest': sim/vendor_graph_sim/data/torch_npu_manifests/torch_npu-<version>.json, read from the
# wheel; source 'research': from torch_npu's source and notes, no manifest.
# Every pre-release on PyPI, classified from its own wheel: a pre-release is a snapshot of an earlier
# train than the release it precedes, often of an older generation.
PRERELEASES: tuple[Release, ...] = (
    Release("2.1.0rc1", "G0", "2023-10-16", "manifest"),
    Release("2.2.0rc1", "G0", "2024-02-07", "manifest"),
    Release("2.3.1rc1", "G0", "2024-06-06", "manifest"),
    Release("2.4.0rc1", "G0", "2024-08-09", "manifest"),
    Release("2.5.1rc1", "G0", "2024-11-08", "manifest"),
    Release("2.6.0rc1", "G1", "2025-04-24", "manifest"),
    Release("2.7.1rc1", "G2a", "2025-06-10", "manifest"),
    Release("2.8.0rc1", "G2a", "2025-08-11", "manifest"),
    Release("2.9.0rc1", "G2b", "2025-10-16", "manifest"),
    Release("2.10.0rc1", "G3a", "2026-01-22", "manifest"),
    Release("2.10.0rc2", "G3a", "2026-01-22", "manifest"),
    Release("2.11.0rc1", "G3b", "2026-03-24", "manifest"),
    Release("2.12.0rc1", "G3b", "2026-05-14", "manifest"),
    Release("2.13.0rc1", "G5", "2026-08-10", "manifest"),
)
# What decides each pre-release's generation, read from its wheel (tools/torch_npu_manifest.py deciding()):
# what it lacks of its release's generation when older, else what sets it apart from the generation before.
PRERELEASE_DECIDING: dict[str, tuple[str, ...]] = {
    "2.1.0rc1": (
        "`NPUGraph` (`torch_npu/npu/graphs.py`): no (G1: yes)",
        "`graph_task_group_begin/end`, `graph_task_update_begin/end`: no (G1: yes)",
        "`ExternalEvent` (`torch_npu/npu/streams.py`): no (G1: yes)",
    ),
    "2.2.0rc1": (
        "`NPUGraph` (`torch_npu/npu/graphs.py`): no (G1: yes)",
        "`graph_task_group_begin/end`, `graph_task_update_begin/end`: no (G1: yes)",
        "`ExternalEvent` (`torch_npu/npu/streams.py`): no (G1: yes)",
    ),
    "2.3.1rc1": (
        "`NPUGraph` (`torch_npu/npu/graphs.py`): no (G1: yes)",
        "`graph_task_group_begin/end`, `graph_task_update_begin/end`: no (G1: yes)",
        "`ExternalEvent` (`torch_npu/npu/streams.py`): no (G1: yes)",
    ),
    "2.4.0rc1": (
        "`NPUGraph` (`torch_npu/npu/graphs.py`): no (G1: yes)",
        "`graph_task_group_begin/end`, `graph_task_update_begin/end`: no (G1: yes)",
        "`ExternalEvent` (`torch_npu/npu/streams.py`): no (G1: yes)",
    ),
    "2.5.1rc1": (
        "`NPUGraph` (`torch_npu/npu/graphs.py`): no (G1: yes)",
        "`graph_task_group_begin/end`, `graph_task_update_begin/end`: no (G1: yes)",
        "`ExternalEvent` (`torch_npu/npu/streams.py`): no (G1: yes)",
    ),
    "2.6.0rc1": (
        "`NPUGraph.update`: no (G2a: yes)",
        "`graph(auto_dispatch_capture=)`: no (G2a: yes)",
        "update()'s length check: none (G2a: `compares_records_with_itself`)",
        "update() does not intercept `npu_fused_infer_attention_score{,.out}` (G2a: does)",
    ),
    "2.7.1rc1": (
        "not exactly G2a: update() `npu_fused_infer_attention_score`: records nothing (G2a: records it)",
        "update() does not intercept `npu_fused_infer_attention_score.default` (G2b: does)",
        "update() `npu_fused_infer_attention_score`: records nothing (G2b: records it)",
    ),
    "2.8.0rc1": (
        "update() does not intercept `npu_fused_infer_attention_score.default` (G2b: does)",
    ),
    "2.9.0rc1": (
        "`NPUGraph.debug_dump`: no (G3a: yes)",
        "update()'s `args[i]` writes check the key: no writes (G3a: no)",
        "update() does not intercept `_npu_paged_attention.default`, "
        "`npu_fused_infer_attention_score_v2{,.default,.out}`, `npu_multi_head_latent_attention.out` (G3a: does)",
        "update() `npu_fused_infer_attention_score{,.default,.out}`: kwargs `any_key` (G3a: "
        "`existing_keys_only`); args `[]` (G3a: `[6:actual_seq_lengths_kv]`)",
    ),
    "2.10.0rc1": (
        "update() by op handlers (`torch_npu/npu/_npugraph_handlers/`): no (G3b: yes)",
        "update()'s length check: `compares_records_with_itself` (G3b: `raises_on_mismatch`)",
        "update()'s `args[i]` writes check the key: no (G3b: yes)",
    ),
    "2.10.0rc2": (
        "update() by op handlers (`torch_npu/npu/_npugraph_handlers/`): no (G3b: yes)",
        "update()'s length check: `compares_records_with_itself` (G3b: `raises_on_mismatch`)",
        "update()'s `args[i]` writes check the key: no (G3b: yes)",
    ),
    "2.11.0rc1": (
        "update() does not intercept `npu_fusion_attention_grad_v3{,.default,.out}`, "
        "`npu_fusion_attention_v3{,.default,.out}` (G4: does)",
        "update() `npu_fused_infer_attention_score{,.default,.out}`: args `[6:actual_seq_lengths_kv]` (G4: "
        "`[5:actual_seq_lengths, 6:actual_seq_lengths_kv]`)",
        "update() `npu_fused_infer_attention_score_v2{,.default,.out}`: args `[8:actual_seq_kvlen]` (G4: "
        "`[7:actual_seq_qlen, 8:actual_seq_kvlen]`)",
    ),
    "2.12.0rc1": (
        "not exactly G3b: update() intercepts `npu_fusion_attention_grad_v3{,.default,.out}`, "
        "`npu_fusion_attention_v3{,.default,.out}` (G3b: no)",
        "update() `npu_fused_infer_attention_score{,.default,.out}`: args `[6:actual_seq_lengths_kv]` (G4: "
        "`[5:actual_seq_lengths, 6:actual_seq_lengths_kv]`)",
        "update() `npu_fused_infer_attention_score_v2{,.default,.out}`: args `[8:actual_seq_kvlen]` (G4: "
        "`[7:actual_seq_qlen, 8:actual_seq_kvlen]`)",
    ),
    "2.13.0rc1": (
        "`ExternalStream` (`torch_npu/npu/streams.py`): yes (G4: no)",
    ),
}
RELEASES: tuple[Release, ...] = (
    Release("2.1.0", "G0", "2023-12-25", "manifest"),
    Release("2.1.0.post3", "G0", "2024-04-18", "manifest"),
    Release("2.1.0.post6", "G0", "2024-07-16", "manifest"),
    Release("2.1.0.post8", "G0", "2024-10-29", "manifest"),
    Release("2.1.0.post10", "G0", "2025-01-04", "manifest"),
    Release("2.1.0.post12", "G1", "2025-04-24", "manifest"),
    Release("2.1.0.post13", "G2a", "2025-07-22", "manifest"),
    Release("2.1.0.post17", "G2b", "2025-10-23", "manifest"),
    Release("2.2.0", "G0", "2024-04-18", "manifest"),
    Release("2.2.0.post2", "G0", "2024-07-16", "manifest"),
    Release("2.3.1", "G0", "2024-07-16", "manifest"),
    Release("2.3.1.post2", "G0", "2024-10-29", "manifest"),
    Release("2.3.1.post4", "G0", "2025-01-04", "manifest"),
    Release("2.3.1.post6", "G1", "2025-04-24", "manifest"),
    Release("2.4.0", "G0", "2024-10-29", "manifest"),
    Release("2.4.0.post2", "G0", "2025-01-04", "manifest"),
    Release("2.4.0.post4", "G1", "2025-04-24", "manifest"),
    Release("2.5.1", "G1", "2025-04-24", "manifest"),
    Release("2.5.1.post1", "G2a", "2025-07-22", "manifest"),
    Release("2.6.0", "G2a", "2025-07-22", "manifest"),
    Release("2.6.0.post3", "G2c", "2025-10-23", "manifest"),
    Release("2.6.0.post5", "G3a", "2026-01-13", "manifest"),
    Release("2.7.1", "G2b", "2025-10-23", "manifest"),
    Release("2.7.1.post2", "G3a", "2026-01-13", "manifest"),
    Release("2.7.1.post4", "G3b", "2026-04-29", "manifest"),
    Release("2.7.1.post6", "G3b", "2026-06-24", "manifest"),
    Release("2.7.1.post8", "G4", "2026-07-25", "manifest"),
    Release("2.7.1.post10", "G4", "2026-08-29", "manifest"),
    Release("2.7.1.post11", "G5", "2026-10-15", "manifest"),
    Release("2.8.0", "G2b", "2025-10-23", "manifest"),
    Release("2.8.0.post2", "G3a", "2026-01-13", "manifest"),
    Release("2.8.0.post4", "G3b", "2026-04-29", "manifest"),
    Release("2.8.0.post5", "G3b", "2026-06-24", "manifest"),
    Release("2.9.0", "G3a", "2026-01-13", "manifest"),
    Release("2.9.0.post2", "G3b", "2026-04-30", "manifest"),
    Release("2.9.0.post4", "G3b", "2026-06-24", "manifest"),
    Release("2.9.0.post6", "G4", "2026-07-25", "manifest"),
    Release("2.9.0.post8", "G4", "2026-08-29", "manifest"),
    Release("2.9.0.post9", "G5", "2026-10-15", "manifest"),
    Release("2.9.1", "G3b", "2026-05-11", "manifest"),
    Release("2.10.0", "G3b", "2026-04-29", "manifest"),
    Release("2.10.0.post2", "G3b", "2026-06-24", "manifest"),
    Release("2.10.0.post4", "G4", "2026-07-25", "manifest"),
    Release("2.10.0.post6", "G4", "2026-08-29", "manifest"),
    Release("2.10.0.post7", "G5", "2026-10-15", "manifest"),
    Release("2.11.0", "G4", "2026-07-25", "manifest"),
    Release("2.11.0.post2", "G4", "2026-08-29", "manifest"),
    Release("2.11.0.post3", "G5", "2026-10-15", "manifest"),
    Release("2.12.0", "G4", "2026-07-25", "manifest"),
    Release("2.12.0.post2", "G4", "2026-08-29", "manifest"),
    Release("2.12.0.post3", "G5", "2026-10-15", "manifest"),
    Release("2.13.0", "G5", "2026-10-15", "manifest"),
    Release("2.14.0", "G5", "2026-10-15", "manifest"),
)
# END GENERATED TABLE

_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}
_FINAL = (3, 0)  # after every pre-release of the same release

_PEP440 = re.compile(
    r"""
    ^\s*v?
    (?P<release>\d+(?:\.\d+)*)
    (?:[-_.]?(?P<pre>a|alpha|b|beta|c|rc|pre|preview)[-_.]?(?P<pre_n>\d*))?
    (?P<postseg>-(?P<post_implicit>\d+)|[-_.]?(?:post|rev|r)[-_.]?(?P<post>\d*))?
    (?P<dev>[-_.]?dev[-_.]?\d*)?
    (?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?
    \s*$
    """,
    re.IGNORECASE | re.VERBOSE,
)


def _key(version: str) -> tuple[tuple[int, ...], tuple[int, int], int] | None:
    """(release without trailing zeros, pre-release (rank, number) or after all of them, post number or -1),
    ignoring dev and local parts: ``2.12.0.rc1``, ``2.12.0-rc1`` and ``2.12.0rc1`` are one key."""
    match = _PEP440.match(version)
    if match is None:
        return None
    release = tuple(int(part) for part in match.group("release").split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    pre = _FINAL
    if match.group("pre"):
        pre = (_PRE_RANK[match.group("pre").lower()], int(match.group("pre_n") or 0))
    if match.group("postseg") is None:
        return release, pre, -1
    return release, pre, int(match.group("post_implicit") or match.group("post") or 0)


KNOWN_VERSIONS: tuple[str, ...] = tuple(r.version for r in RELEASES)  # the releases, in version order
PRERELEASE_VERSIONS: tuple[str, ...] = tuple(r.version for r in PRERELEASES)  # the pre-releases, likewise
GENERATION_BY_VERSION: dict[str, str] = {r.version: r.generation for r in (*RELEASES, *PRERELEASES)}


def _index() -> dict[tuple[tuple[int, ...], tuple[int, int], int], Release]:
    index = {}
    for pre, rows in ((False, RELEASES), (True, PRERELEASES)):
        for release in rows:
            key = _key(release.version)
            if key is None or key in index:
                raise RuntimeError(f"bad or duplicate torch_npu release in the table: {release}")
            if (key[1] != _FINAL) != pre:
                raise RuntimeError(f"torch_npu {release.version}: a pre-release belongs in PRERELEASES, only there")
            index[key] = release
    return index


_BY_KEY = _index()


def is_prerelease(version: str) -> bool:
    """Whether a torch_npu version string names a pre-release (``a``/``b``/``rc``); ValueError if it is no
    PEP 440 version."""
    key = _key(version) if isinstance(version, str) else None
    if key is None:
        raise ValueError(f"{version!r} is not a PEP 440 version string")
    return key[1] != _FINAL


def preceded_release(version: str) -> Release | None:
    """The row of the release a pre-release precedes (``2.10.0rc2`` -> ``2.10.0``), None when that release is
    not in the table; ValueError for a version that is no pre-release."""
    key = _key(version) if isinstance(version, str) else None
    if key is None or key[1] == _FINAL:
        raise ValueError(f"{version!r} is not a torch_npu pre-release")
    return _BY_KEY.get((key[0], _FINAL, -1))


def _covered() -> str:
    pre = (f" and PyPI's {len(PRERELEASE_VERSIONS)} pre-releases ({PRERELEASE_VERSIONS[0]} to "
           f"{PRERELEASE_VERSIONS[-1]})" if PRERELEASE_VERSIONS else "")
    return (f"{len(KNOWN_VERSIONS)} releases from {KNOWN_VERSIONS[0]} to {KNOWN_VERSIONS[-1]}{pre} "
            f"({GENERATIONS[0]}..{GENERATIONS[-1]})")


def release_of(version: str) -> Release:
    """The table row for a torch_npu version string.

    Accepts any PEP 440 spelling of a PyPI release: ``2.8.0.post2``,
    ``2.8.0-post2``, ``2.8.0post2``, ``v2.8.0.post2``, and a local part such as
    ``2.8.0.post2+git729dda3`` or ``2.12.0+cpu`` (ignored).  A pre-release has
    its own row, read from its own wheel (``2.10.0rc2``, also spelled
    ``2.10.0.rc2`` or ``2.10.0-rc2``; some wheels' ``__version__`` is
    ``2.12.0.rc1``): torch_npu has published pre-releases on PyPI
    (:data:`PRERELEASE_VERSIONS`), and each is a snapshot of an earlier train
    than the release it precedes, often of an older generation (2.10.0rc2 is
    G3a, 2.10.0 G3b).  So a pre-release not on PyPI is not mapped to its
    release but raises ValueError, as do development builds (``.devN``) and
    other versions not on PyPI.
    """
    if not isinstance(version, str):
        raise TypeError(f"torch_npu version must be a str, not {type(version).__name__}")
    match = _PEP440.match(version)
    key = _key(version)
    if match is None or key is None:
        raise ValueError(f"{version!r} is not a PEP 440 version string")
    if match.group("dev"):
        raise ValueError(
            f"torch_npu {version!r} is a development build; its graph API cannot be "
            "looked up by version: detect the features at runtime instead"
        )
    release = _BY_KEY.get(key)
    if release is None and key[1] != _FINAL:
        raise ValueError(
            f"torch_npu {version!r} is a pre-release that is not on PyPI: the table covers {_covered()}. "
            "A pre-release is a snapshot of an earlier train than the release it precedes (2.10.0rc2 is G3a, "
            "2.10.0 G3b), so its generation is not its release's: detect the graph API at runtime, or add it "
            "with `python3.11 tools/torch_npu_manifest.py --versions V --write-table`"
        )
    if release is None:
        raise ValueError(
            f"torch_npu {version!r} is not a known PyPI release: the table covers {_covered()}; versions "
            "never published on PyPI (e.g. 2.8.0.post1) are not covered. Detect the graph API at runtime, or add "
            "the release with `python3.11 tools/torch_npu_manifest.py --versions V --write-table`"
        )
    return release


def generation_of(version: str) -> str:
    """Graph-API generation (``"G0"`` … ``"G5"``) of a torch_npu version string (a release or a pre-release)."""
    return release_of(version).generation


def facts_of(version: str) -> dict[str, Any]:
    """``GENERATION_FACTS`` entry for a torch_npu version string."""
    return GENERATION_FACTS[generation_of(version)]
