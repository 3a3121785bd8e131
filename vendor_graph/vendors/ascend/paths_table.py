"""The torch_npu release -> seq-len update path table (``vendor-graph paths``, docs/ascend.md, ``doctor``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from packaging.version import Version

    from .seqlen import AttentionOp


def seqlen_ops() -> list[tuple[str, AttentionOp, str]]:
    """(column name, attention op, overload) of the seq-len path table (and of ``doctor``)."""
    from .seqlen import FIA, FIA_V2, MLA, PAGED_ATTENTION, PAGED_ATTENTION_MLA

    return [("FIA `.default`", FIA, ".default"), ("FIA `.out`", FIA, ".out"), ("FIA v2 `.out`", FIA_V2, ".out"),
            ("paged attention", PAGED_ATTENTION, ".default"), ("MLA `.out`", MLA, ".out"),
            ("paged attention MLA", PAGED_ATTENTION_MLA, ".default")]


def seqlen_path_table() -> str:
    """Markdown: every torch_npu release and pre-release of the table -> the seq-len update path per attention op."""
    from .releases import GENERATION_FACTS, PRERELEASES, RELEASES
    from .seqlen import path_for

    ops = seqlen_ops()
    lines = ["| torch_npu | generation | " + " | ".join(name for name, _, _ in ops) + " |",
             "|---|---|" + "---|" * len(ops)]
    for release in sorted((*RELEASES, *PRERELEASES), key=lambda r: (r.generation, _version_key(r.version))):
        facts = GENERATION_FACTS[release.generation]
        lines.append(f"| {release.version} | {release.generation} | "
                     + " | ".join(path_for(facts, op, overload) for _, op, overload in ops) + " |")
    return "\n".join(lines)


def _version_key(version: str) -> Version:
    from packaging.version import Version

    return Version(version)
