"""The upstream breakages: where lmdeploy's calls and dlinfer's code disagree, for which vendors, lmdeploy series
and dlinfer generations, and what vendor_graph does about each. This table is the only place they are written:
``vendor-graph doctor``, ``tools/support_matrix.py`` (docs/support.md) and the README's status grid read it,
and :mod:`vendor_graph.upstream.compat` refuses a series only where an entry here says so.

A dlinfer generation is recognised by what its modules contain, never by a version string
(:func:`vendor_graph.vendors.ascend.dlinfer_adapter.dlinfer_generation`). Imports nothing beyond the standard
library, so the tools read it without torch.
"""

from __future__ import annotations

from dataclasses import dataclass

# dlinfer generations (docs/upstream.md): the PyPI wheel, and GitHub main before and after a breaking change
PYPI_027 = "0.2.7"
A50184E_ERA = "a50184e-era"
POST_350 = "post-#350"
DLINFERS: dict[str, str] = {
    PYPI_027: "dlinfer 0.2.7 (dlinfer-ascend on PyPI, aarch64 wheels only; a source build for Camb and MACA)",
    A50184E_ERA: "dlinfer's GitHub main before PR #350 (a50184e, 2026-07-20)",
    POST_350: "dlinfer's GitHub main from PR #350 on (ae9862a1: FIA attention, one graph-update path)",
}
VENDORS = ("ascend", "camb", "maca")


def series_key(series: str) -> tuple[int, ...]:
    return tuple(int(part) for part in series.split("."))


@dataclass(frozen=True)
class Breakage:
    """One disagreement between lmdeploy and dlinfer (or a missing distribution)."""

    name: str
    vendors: tuple[str, ...]
    since: str  # the first lmdeploy series it affects
    until: str | None  # the last one (None: every later series too)
    dlinfers: tuple[str, ...]  # the dlinfer generations that have it (keys of DLINFERS)
    what: str
    blocks: bool = True  # the engine cannot run that combination unless vendor_graph bridges it
    bridge: str | None = None  # vendor_graph's bridge for it: a name in vendor_graph.install.bridges.NAMES, or "runner"
    bridged_on: tuple[str, ...] = ()  # the vendors the bridge covers
    does: str = ""  # what vendor_graph does about it (how it bridges, or how it refuses)
    refuses: bool = False  # vendor_graph refuses these (vendor, series) pairs outright

    def applies(self, vendor: str, series: str) -> bool:
        key = series_key(series)
        return (vendor in self.vendors and key >= series_key(self.since)
                and (self.until is None or key <= series_key(self.until)))

    def bridged_for(self, vendor: str) -> bool:
        return self.bridge is not None and vendor in self.bridged_on

    def span(self) -> str:
        if self.until is None:
            return f"lmdeploy >= {self.since}"
        return f"lmdeploy {self.since}" + (f" to {self.until}" if self.until != self.since else "")


BREAKAGES: tuple[Breakage, ...] = (
    Breakage(
        "version-module", ("ascend",), "0.17", None, (PYPI_027, A50184E_ERA),
        "lmdeploy's Ascend `init()` imports `dlinfer.vendor.ascend.version` (outside any try), which dlinfer "
        "gained only in PR #350: the engine cannot start on an NPU"),
    Breakage(
        "prefill-attention", VENDORS, "0.18", None, (PYPI_027, A50184E_ERA, POST_350),
        "lmdeploy 0.18's dlinfer prefill kernel calls `dlinfer.ops.prefill_attention(..., "
        "actual_seq_lengths_cpu=...)`, and `dlinfer.ops.paged_prefill_attention` with two length arguments "
        "fewer, which no dlinfer takes (PR #350 did not change that): every prefill raises TypeError; decode works",
        bridge="prefill-attention", bridged_on=VENDORS,
        does="vendor_graph's `prefill-attention` bridge hands dlinfer's ops what lmdeploy 0.16's backend for the "
             "vendor passed (`VENDOR_GRAPH_BRIDGES`): Ascend's host lengths; Camb's and MACA's device tensors "
             "(`q_start_loc` their cumulative `cu_seqlens`, Camb's `cu_seq_lens_kv`), rebuilt on the device from "
             "the lengths 0.18 passes"),
    Breakage(
        "state-cache", ("ascend",), "0.16", "0.17", (A50184E_ERA, POST_350),
        "dlinfer's GitHub main replaces `StateCacheEngine.allocate_caches` with a three-argument version, and "
        "lmdeploy's `StateCacheEngine` passes it `state_specs=` and `num_layers=`: the engine's cache cannot be "
        "built, eager mode too",
        bridge="state-cache", bridged_on=("ascend",),
        does="vendor_graph's `state-cache` bridge adapts the call (`VENDOR_GRAPH_BRIDGES`)"),
    Breakage(
        "runner-is-mla", ("ascend",), "0.17", None, (PYPI_027, A50184E_ERA),
        "lmdeploy's Ascend `build_graph_runner` passes `is_mla=` to dlinfer's `AscendGraphRunner`, which takes it "
        "only from PR #350 on: the engine cannot be built, eager mode too",
        bridge="runner", bridged_on=("ascend",),
        does="vendor_graph builds its own runner there instead"),
    Breakage(
        "decode-head-size", ("ascend",), "0.16", None, (PYPI_027,),
        "lmdeploy passes `q_seqlens` positionally to `dlinfer.ops.paged_decode_attention`, whose 0.2.7 form has "
        "no `q_seq_len`: the first decode raises TypeError (multiple values for `head_size_v`)",
        does="vendor_graph refuses dlinfer 0.2.7 at activation, naming the fix (dlinfer's GitHub main)"),
    Breakage(
        "prefill-mask", ("ascend",), "0.16", "0.16", (POST_350,),
        "lmdeploy 0.16's Ascend backend hands a prefill without history a `(max_q_seq_len, max_kv_seq_len)` causal "
        "mask, and dlinfer's FIA prefill from PR #350 on runs a masked prefill with sparse_mode 3, which takes only "
        "the 2048x2048 compressed mask lmdeploy 0.17 builds: such a prefill raises"),
    Breakage(
        "no-distribution", ("camb", "maca"), "0.16", None, (PYPI_027, A50184E_ERA, POST_350),
        "no dlinfer-camb or dlinfer-maca distribution exists: build dlinfer from source "
        "(`DEVICE=camb` / `DEVICE=maca`)", blocks=False),
    Breakage(
        "camb-mla-decode", ("camb",), "0.16", None, (A50184E_ERA, POST_350),
        "dlinfer's camb `paged_decode_attention` views its output buffer with the query's head size, which an MLA "
        "model's value head size is not (DeepSeek-V2/V3): the first decode of such a model raises RuntimeError, "
        "eager mode too; other models run", blocks=False,
        does="nothing to bridge: the view is inside dlinfer's kernel wrapper"),
    Breakage(
        "maca-mla-prefill", ("maca",), "0.16", None, (A50184E_ERA, POST_350),
        "dlinfer's maca MLA prefill views the packed tokens as (batch, seq, heads, dim), so a prefill batch of "
        "prompts of different lengths raises RuntimeError, and its MLA `paged_prefill_attention` permutes a "
        "five-dimensional key cache where lmdeploy's MACA cache has four (prefix caching raises); eager mode too; "
        "other models run", blocks=False,
        does="nothing to bridge: inside dlinfer's kernel wrapper"),
)


def applying(vendor: str, series: str) -> list[Breakage]:
    """The breakages that affect ``vendor`` on lmdeploy ``series`` (major.minor), whatever the dlinfer."""
    return [b for b in BREAKAGES if b.applies(vendor, series)]


def refusal(vendor: str, series: str) -> Breakage | None:
    """The breakage for which vendor_graph refuses ``vendor`` on ``series`` outright, if any."""
    return next((b for b in applying(vendor, series) if b.refuses), None)


def refused_series() -> set[str]:
    """The series some entry refuses (a refusing entry names one series: ``since == until``), for tables that
    list them beside the supported ones."""
    return {b.since for b in BREAKAGES if b.refuses}


def blocking(vendor: str, series: str, dlinfer: str | None = None) -> list[Breakage]:
    """What stops ``vendor`` on ``series`` with vendor_graph active (blocking entries it does not bridge), for
    ``dlinfer`` (a key of :data:`DLINFERS`) or for any dlinfer when None."""
    return [b for b in applying(vendor, series) if b.blocks and not b.bridged_for(vendor)
            and (dlinfer is None or dlinfer in b.dlinfers)]


def dlinfers_that_run(vendor: str, series: str) -> list[str]:
    """The dlinfer generations on which ``vendor`` runs lmdeploy ``series`` with vendor_graph active."""
    stops = blocking(vendor, series)
    return [d for d in DLINFERS if not any(d in b.dlinfers for b in stops)]


__all__ = ["A50184E_ERA", "BREAKAGES", "Breakage", "DLINFERS", "POST_350", "PYPI_027", "applying", "refusal",
           "refused_series", "blocking", "dlinfers_that_run"]
