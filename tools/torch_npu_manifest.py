#!/usr/bin/env python3
"""Extract torch_npu graph-API facts from the PyPI wheels into JSON manifests.

torch_npu is never installed or imported: each wheel is downloaded from the
address PyPI's JSON API gives (and checked against its sha256), opened as a
zip, and its Python sources are read with :mod:`ast`.  Only facts (names,
parameters, op names, keys, indices) are written; no torch_npu source is
stored.  Releases and pre-releases (``2.10.0rc2``) are handled alike: one wheel
per version, chosen by the same rule (:func:`choose_wheel`).

Usage (stdlib only; run with python3.11)::

    python3.11 tools/torch_npu_manifest.py --versions 2.5.1 2.14.0 2.10.0rc2
    python3.11 tools/torch_npu_manifest.py --all          # every version on PyPI,
                                                          # pre-releases included
    python3.11 tools/torch_npu_manifest.py --new          # those without a manifest
    python3.11 tools/torch_npu_manifest.py --check --versions 2.4.0
    python3.11 tools/torch_npu_manifest.py --write-table  # regenerate the table
                                                          # in vendor_graph/vendors/ascend/releases.py
    python3.11 tools/torch_npu_manifest.py --check --write-table  # all, offline
                                                          # with a warm --cache

``--check`` without ``--versions`` re-extracts every committed manifest; with
``--write-table`` it also checks that the table is up to date.  Exit status:
0 same, 1 differences (a unified diff is printed), 2 a wheel whose code this
extractor does not understand, or a release whose facts match no generation
(extend it rather than guess).  A pre-release whose facts match no generation
takes the newest one it covers (:func:`classification`); the table says how it
differs (``PRERELEASE_DECIDING``).

Manifest schema (``"schema": 1``), one file per release at
``sim/vendor_graph_sim/data/torch_npu_manifests/torch_npu-<version>.json``, written with sorted keys, a
2-space indent and a trailing newline, so reruns are byte-identical.

Shared shapes:

* *signature*: ``{"params": [param, ...], "decorators": [str, ...]}``.
  A *param* is ``{"name", "kind", "default"?, "annotation"?}``; ``kind`` is
  ``positional_only``, ``positional_or_keyword``, ``var_positional``,
  ``keyword_only`` or ``var_keyword``; ``default`` and ``annotation`` are
  source text and absent when there is none.  ``self``/``cls`` are included.
* *class*: ``{"bases": [str], "methods": {name: signature},
  "class_attributes": [str], "instance_attributes": [str]}``;
  ``instance_attributes`` are ``self.X`` assigned in ``__init__``/``__new__``.

Top level:

* ``schema``: 1.  ``version``: the PyPI version asked for.
* ``wheel``: ``filename``, ``sha256``, ``size``, ``build_date`` (zip date of
  ``torch_npu/version.py``, i.e. the release train), ``requires_dist``.
* ``version_py``: ``__version__`` and ``git_version`` as assigned in
  ``torch_npu/version.py`` (null when absent).
* ``files``: ``{path: bool}`` for the graph-related files and folders.
* ``binary_strings``: ``{token: bool}``, whether each token occurs as bytes in
  ``torch_npu/_C*.so`` or ``torch_npu/lib/libtorch_npu.so`` (substring test).
* ``graph_api``: ``present`` (``graphs.py`` defines ``NPUGraph``),
  ``all`` (the literal ``__all__`` of ``graphs.py`` or null),
  ``graph_enter_calls`` (``[{"call", "when"}]``: statement calls in
  ``graph.__enter__`` in source order, ``when`` the guarding name or null),
  ``functions`` (public module-level functions: signatures),
  ``classes`` (every class of ``graphs.py``).
* ``streams``: ``{"classes": {...}}`` for ``torch_npu/npu/streams.py``.
* ``npu_exports``: ``{name: {"from": module, "in_all": bool}}``, names that
  ``torch_npu/npu/__init__.py`` imports from ``.graphs``, ``.streams`` or
  ``._npugraph_handlers``, and whether its literal ``__all__`` lists them.
* ``auto_dispatch_capture``: ``present``, ``graph_init_index`` (index among
  ``graph.__init__``'s parameters without ``self``, or null), ``locations``
  (``Class.method:param`` / ``Class.method:attribute`` in ``graphs.py``) and
  ``files`` (every ``.py`` in the wheel naming it).
* ``task_group_api``: ``present`` (all four functions defined in
  ``graphs.py``) and ``functions`` (the ``graph_task_*`` signatures).
* ``handlers``: null before the handler registry, else ``{"registry": name,
  "classes": {cls: {"file", "bases", "ops", "hooks"}}}``.
* ``update``: ``{"present": false}`` when ``NPUGraph.update`` is missing, else

  - ``signature``; ``requires_auto_dispatch_capture`` (``update`` raises unless
    the flag is set); ``dispatch``: ``inline`` (op names tested in
    ``__torch_dispatch__``) or ``handler_registry``;
  - ``length_check``: ``absent``, ``compares_records_with_itself`` (the check
    can never fire) or ``raises_on_mismatch``; ``broadcasts_single_input``;
  - ``update_stream``: ``per_instance`` or ``class_level``;
  - ``records_attribute``: e.g. ``graph_dispatch_mode.graph_dispatch_records``;
  - ``ops``: one entry per intercepted ``func.__name__``:
    ``recorded_as`` (the op stored in the record; ``.default`` calls are
    swapped to ``.out``), ``handler``, ``should_handle`` (a hook can decline
    the op at capture), ``kwargs_rule`` (``any_key``: every key of the
    update dict is written into the recorded kwargs; ``existing_keys_only``:
    only keys already recorded; a ``len(args)`` condition is appended when
    the rule only applies then; null: no kwargs are written),
    ``positional`` (``[{"index", "key", "key_guarded", "bounds_checked"}]``:
    ``args[index] = update_input[key]``; ``key_guarded`` false means a
    missing key raises ``KeyError``), ``forced_kwargs``
    (``[{"name", "key"}]``: kwargs written even when not recorded).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import importlib.util
import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path
from typing import Any

SCHEMA = 1
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MANIFESTS = ROOT / "sim" / "vendor_graph_sim" / "data" / "torch_npu_manifests"
DEFAULT_MODULE = ROOT / "vendor_graph" / "vendors" / "ascend" / "releases.py"
DEFAULT_CACHE = Path("/tmp/torch_npu_wheels")

# The wheel read for a version is chosen from PyPI's JSON API, the same way for releases and pre-releases:
# the first Python of PYTHONS that has an x86_64 wheel of one of PLATFORMS, then the first such platform,
# then the file name; yanked files and sdists are never chosen.  Up to 2.6.x torch_npu builds manylinux2014,
# from 2.7.1 on manylinux_2_28.  Every release from 2.1.0.post8 on and the pre-releases from 2.5.1rc1 on have a
# cp311 build; 2.1.0rc1 … 2.4.0rc1 and the releases 2.1.0, 2.1.0.post3/post6, 2.2.0, 2.2.0.post2 and 2.3.1 stop
# at cp310 (which vendor_graph supports, so they are in the table too: all G0).
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")
PYTHONS = ("3.11", "3.10", "3.9", "3.12")
PYPI_JSON = "https://pypi.org/pypi/torch-npu/json"

GRAPHS = "torch_npu/npu/graphs.py"
STREAMS = "torch_npu/npu/streams.py"
NPU_INIT = "torch_npu/npu/__init__.py"
VERSION_PY = "torch_npu/version.py"
HANDLERS_DIR = "torch_npu/npu/_npugraph_handlers/"
TRACKED_PATHS = (
    GRAPHS,
    STREAMS,
    HANDLERS_DIR,
    "torch_npu/npu/_aclgraph_update_plan/",
    "torch_npu/npu/_graph_tree.py",
    "torch_npu/dynamo/npugraph_ex/",
)
BINARY_TOKENS = (
    "_NPUGraph",
    "_NPUTaskGroupHandle",
    "_graph_pool_handle",
    "_graph_task_group_begin",
    "_graph_task_update_begin",
    "_npu_isCurrentStreamCapturing",
    "register_generator_state",
    "report_shape",
)
TASK_GROUP_FUNCTIONS = (
    "graph_task_group_begin",
    "graph_task_group_end",
    "graph_task_update_begin",
    "graph_task_update_end",
)
EXPORT_MODULES = ("graphs", "streams", "_npugraph_handlers")
TABLE_BEGIN = "# BEGIN GENERATED TABLE"
TABLE_END = "# END GENERATED TABLE"


class ExtractionError(RuntimeError):
    """The wheel's code has a shape this extractor does not understand."""


# --------------------------------------------------------------------------
# versions and wheels


_VERSION_RE = re.compile(r"^(\d+(?:\.\d+)*)(?:(a|b|rc)(\d+))?(?:\.post(\d+))?$")
_PRE_RANK = {"a": 0, "b": 1, "rc": 2}
_FINAL = (3, 0)  # sorts after every pre-release of the same release


def version_key(version: str) -> tuple[tuple[int, ...], tuple[int, int], int]:
    """Sort key for the ``X.Y.Z[{a,b,rc}N][.postN]`` versions torch_npu publishes (PEP 440 order:
    ``2.10.0rc1 < 2.10.0rc2 < 2.10.0 < 2.10.0.post2``)."""
    match = _VERSION_RE.match(version)
    if not match:
        raise ValueError(f"unsupported torch_npu version string {version!r}")
    release = tuple(int(p) for p in match.group(1).split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    pre = (_PRE_RANK[match.group(2)], int(match.group(3))) if match.group(2) else _FINAL
    post = int(match.group(4)) if match.group(4) is not None else -1
    return release, pre, post


def is_prerelease(version: str) -> bool:
    return version_key(version)[1] != _FINAL


def final_of(version: str) -> str:
    """The release a pre-release precedes (``2.10.0rc2`` -> ``2.10.0``); a release itself unchanged."""
    match = _VERSION_RE.match(version)
    if not match:
        raise ValueError(f"unsupported torch_npu version string {version!r}")
    return match.group(1) if match.group(2) else version


def _wheel_rank(filename: str) -> tuple[int, int, str] | None:
    """Where a file stands in the choice rule (lower first), None when the rule never takes it."""
    if not filename.endswith(".whl"):
        return None
    parts = filename[: -len(".whl")].split("-")
    if len(parts) < 5:
        return None
    python_tags, platform_tags = parts[-3].split("."), parts[-1].split(".")
    pythons = [i for i, p in enumerate(PYTHONS) if "cp" + p.replace(".", "") in python_tags]
    platforms = [PLATFORMS.index(p) for p in platform_tags if p in PLATFORMS]
    if not pythons or not platforms:
        return None
    return min(pythons), min(platforms), filename


def choose_wheel(files: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The one file of a version's PyPI JSON ``urls`` list that this extractor reads (None: no usable wheel)."""
    ranked = []
    for entry in files:
        if entry.get("packagetype", "bdist_wheel") != "bdist_wheel" or entry.get("yanked"):
            continue
        rank = _wheel_rank(entry["filename"])
        if rank is not None:
            ranked.append((rank, entry))
    return min(ranked, key=lambda r: r[0])[1] if ranked else None


_PYPI: dict[str, Any] = {}


def pypi_project(url: str = PYPI_JSON) -> dict[str, Any]:
    """PyPI's JSON description of torch_npu (every version and its files), read once per run."""
    if url not in _PYPI:
        with urllib.request.urlopen(url, timeout=60) as reply:
            _PYPI[url] = json.load(reply)
    return _PYPI[url]


def list_pypi_versions(project: dict[str, Any] | None = None) -> list[str]:
    """Every torch_npu version on PyPI that has a wheel the choice rule takes: releases and pre-releases alike
    (``pip index versions`` lists neither pre-releases nor versions without a wheel for its own Python)."""
    project = pypi_project() if project is None else project
    versions = [v for v, files in project["releases"].items() if choose_wheel(files) is not None]
    if not versions:
        raise RuntimeError("PyPI lists no torch_npu version with a usable wheel")
    return sorted(versions, key=version_key)


def cached_wheel(cache: Path, version: str) -> Path | None:
    """The wheel of exactly ``version`` in ``cache`` that the choice rule prefers, if any."""
    found = [p for p in cache.glob("torch_npu-*.whl") if p.name.split("-")[1] == version]
    ranked = sorted((r, p) for p in found if (r := _wheel_rank(p.name)) is not None)
    return ranked[0][1] if ranked else None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_wheel(version: str, cache: Path) -> Path:
    """The wheel of ``version`` the choice rule takes, downloaded into ``cache`` unless it is there (checked
    against PyPI's sha256).  Without PyPI, the best cached wheel of ``version`` is used."""
    cache.mkdir(parents=True, exist_ok=True)
    try:
        project = pypi_project()
    except (urllib.error.URLError, OSError) as exc:
        found = cached_wheel(cache, version)
        if found:
            return found
        raise RuntimeError(f"torch_npu=={version}: no cached wheel in {cache} and PyPI unreachable ({exc})") from None
    chosen = choose_wheel(project["releases"].get(version, []))
    if chosen is None:
        raise RuntimeError(f"PyPI has no wheel of torch_npu=={version} for {PYTHONS} on {PLATFORMS}")
    path = cache / chosen["filename"]
    if path.is_file():
        return path
    partial = path.with_name(path.name + ".part")
    url = urllib.parse.urljoin(PYPI_JSON, chosen["url"])  # a mirror may answer with relative URLs
    with urllib.request.urlopen(url, timeout=600) as reply, partial.open("wb") as out:
        while chunk := reply.read(1 << 20):
            out.write(chunk)
    expected = chosen.get("digests", {}).get("sha256")
    if expected and _sha256(partial) != expected:
        partial.unlink()
        raise RuntimeError(f"{chosen['filename']}: sha256 differs from PyPI's {expected}")
    partial.rename(path)
    return path


# --------------------------------------------------------------------------
# generic AST helpers


def dotted(node: ast.AST | None) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, Any]:
    a = fn.args
    params: list[dict[str, Any]] = []

    def add(arg: ast.arg, kind: str, default: ast.expr | None = None) -> None:
        entry: dict[str, Any] = {"name": arg.arg, "kind": kind}
        if default is not None:
            entry["default"] = ast.unparse(default)
        if arg.annotation is not None:
            entry["annotation"] = ast.unparse(arg.annotation)
        params.append(entry)

    positional = a.posonlyargs + a.args
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults))
    defaults += list(a.defaults)
    for i, arg in enumerate(positional):
        kind = "positional_only" if i < len(a.posonlyargs) else "positional_or_keyword"
        add(arg, kind, defaults[i])
    if a.vararg:
        add(a.vararg, "var_positional")
    for arg, default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        add(arg, "keyword_only", default)
    if a.kwarg:
        add(a.kwarg, "var_keyword")
    return {"params": params, "decorators": [ast.unparse(d) for d in fn.decorator_list]}


def methods_of(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}


def class_summary(cls: ast.ClassDef) -> dict[str, Any]:
    class_attrs: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.Assign):
            class_attrs.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            class_attrs.add(node.target.id)
    inst_attrs: set[str] = set()
    for name, fn in methods_of(cls).items():
        if name in ("__init__", "__new__"):
            for node in ast.walk(fn):
                for target in _assign_targets(node):
                    if isinstance(target, ast.Attribute) and dotted(target.value) == "self":
                        inst_attrs.add(target.attr)
    return {
        "bases": [ast.unparse(b) for b in cls.bases],
        "methods": {n: signature(f) for n, f in sorted(methods_of(cls).items())},
        "class_attributes": sorted(class_attrs),
        "instance_attributes": sorted(inst_attrs),
    }


def _assign_targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        return [node.target]
    return []


def top_level(tree: ast.Module) -> tuple[dict[str, ast.FunctionDef], dict[str, ast.ClassDef]]:
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    return funcs, classes


def literal_all(tree: ast.Module) -> list[str] | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return None
            return [str(v) for v in value]
    return None


def str_list(node: ast.AST) -> list[str] | None:
    """Strings of a str constant or a list/tuple/set of str constants."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        out = []
        for elt in node.elts:
            if not (isinstance(elt, ast.Constant) and isinstance(elt.value, str)):
                return None
            out.append(elt.value)
        return out
    return None


def op_name_test(test: ast.expr, subject: str) -> set[str] | None:
    """Op names if ``test`` is ``<subject>.__name__ in [...]`` (or ``==``, ``or``)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        names: set[str] = set()
        for value in test.values:
            part = op_name_test(value, subject)
            if part is None:
                return None
            names |= part
        return names
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    left = dotted(test.left)
    if left is None or not left.endswith("__name__"):
        return None
    if not (left == f"{subject}.__name__" or left.endswith(f".{subject}.__name__")):
        return None
    if not isinstance(test.ops[0], (ast.In, ast.Eq)):
        return None
    names_list = str_list(test.comparators[0])
    return set(names_list) if names_list is not None else None


def conjuncts(test: ast.expr) -> list[ast.expr]:
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return [c for v in test.values for c in conjuncts(v)]
    return [test]


# --------------------------------------------------------------------------
# update() analysis


@dataclass(frozen=True)
class _Ctx:
    ops: frozenset[str] | None = None  # None: every recorded op
    excluded: frozenset[str] = frozenset()
    tests: tuple[tuple[bool, ast.expr], ...] = ()  # (holds?, test)

    def only(self, ops: set[str]) -> _Ctx:
        chosen = frozenset(ops) if self.ops is None else self.ops & ops
        return _Ctx(chosen - self.excluded, self.excluded, self.tests)

    def without(self, ops: set[str]) -> _Ctx:
        return _Ctx(self.ops, self.excluded | ops, self.tests)

    def test(self, holds: bool, test: ast.expr) -> _Ctx:
        return _Ctx(self.ops, self.excluded, (*self.tests, (holds, test)))

    def applies_to(self, op: str) -> bool:
        return (self.ops is None or op in self.ops) and op not in self.excluded


@dataclass
class _Write:
    ctx: _Ctx
    kind: str  # "kwargs_loop", "arg", "kwarg"
    index: Any = None  # constant, or ("name", id) / ("expr", text) to resolve
    key: Any = None
    rule: str | None = None


@dataclass
class _UpdateWalker:
    """Collects the writes an update function makes into a record's args/kwargs."""

    update_names: set[str]
    where: str
    writes: list[_Write] = field(default_factory=list)
    bindings: list[tuple[_Ctx, dict[str, Any]]] = field(default_factory=list)
    arg_aliases: set[str] = field(default_factory=set)

    def walk(self, body: Iterable[ast.stmt], ctx: _Ctx) -> None:
        for stmt in body:
            ctx = self._stmt(stmt, ctx)

    def _stmt(self, stmt: ast.stmt, ctx: _Ctx) -> _Ctx:
        if isinstance(stmt, ast.If):
            ops = op_name_test(stmt.test, "op_cache_entry")
            if ops is not None:
                self.walk(stmt.body, ctx.only(ops))
                self.walk(stmt.orelse, ctx.without(ops))
                return ctx
            self.walk(stmt.body, ctx.test(True, stmt.test))
            self.walk(stmt.orelse, ctx.test(False, stmt.test))
            if stmt.body and isinstance(stmt.body[-1], (ast.Continue, ast.Return, ast.Raise)):
                return ctx.test(False, stmt.test)  # early exit: later code has "not test"
            return ctx
        if isinstance(stmt, ast.For):
            if isinstance(stmt.iter, ast.Call) and dotted(stmt.iter.func) == "zip":
                if isinstance(stmt.target, ast.Tuple) and len(stmt.target.elts) == 2:
                    second = stmt.target.elts[1]
                    if isinstance(second, ast.Name):
                        self.update_names.add(second.id)
            self.walk(stmt.body, ctx)
            return ctx
        if isinstance(stmt, (ast.With, ast.While)):
            self.walk(stmt.body, ctx)
            return ctx
        if isinstance(stmt, ast.Try):
            for block in (stmt.body, *(h.body for h in stmt.handlers), stmt.orelse, stmt.finalbody):
                self.walk(block, ctx)
            return ctx
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            self._assign(stmt.targets[0], stmt.value, ctx)
        return ctx

    def _is_update_lookup(self, node: ast.expr) -> ast.expr | None:
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            if node.value.id in self.update_names:
                return node.slice
        return None

    def _assign(self, target: ast.expr, value: ast.expr, ctx: _Ctx) -> None:
        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
            if len(target.elts) == len(value.elts):
                bound = {}
                for t, v in zip(target.elts, value.elts, strict=True):
                    if isinstance(t, ast.Name) and isinstance(v, ast.Constant):
                        bound[t.id] = v.value
                if bound:
                    self.bindings.append((ctx, bound))
            return
        if isinstance(target, ast.Name):
            if isinstance(value, ast.Call) and dotted(value.func) in ("list", "tuple"):
                if value.args and (dotted(value.args[0]) or "").endswith(".args"):
                    self.arg_aliases.add(target.id)
            return
        if not isinstance(target, ast.Subscript):
            return
        container = dotted(target.value) or ""
        key_expr = self._is_update_lookup(value)
        if key_expr is None:
            return
        if container.endswith(".kwargs"):
            if isinstance(target.slice, ast.Name) and isinstance(key_expr, ast.Name):
                if target.slice.id == key_expr.id:
                    self.writes.append(
                        _Write(ctx, "kwargs_loop", rule=self._kwargs_rule(ctx, key_expr.id, container))
                    )
                    return
            self.writes.append(
                _Write(ctx, "kwarg", index=self._const(target.slice), key=self._const(key_expr))
            )
            return
        if container.endswith(".args") or container in self.arg_aliases:
            self.writes.append(_Write(ctx, "arg", index=self._const(target.slice), key=self._const(key_expr)))

    @staticmethod
    def _const(node: ast.expr) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            if isinstance(node.operand, ast.Constant):
                return -node.operand.value
        if isinstance(node, ast.Name):
            return ("name", node.id)
        return ("expr", ast.unparse(node))

    @staticmethod
    def _kwargs_rule(ctx: _Ctx, key: str, container: str) -> str:
        for holds, test in ctx.tests:
            for part in conjuncts(test) if holds else [test]:
                if (
                    isinstance(part, ast.Compare)
                    and dotted(part.left) == key
                    and len(part.ops) == 1
                    and dotted(part.comparators[0]) == container
                    and isinstance(part.ops[0], ast.In if holds else ast.NotIn)
                ):
                    return "existing_keys_only"
        return "any_key"

    # -- interpretation

    def _guards(self, ctx: _Ctx) -> tuple[bool, bool, list[str]]:
        """(key checked in the update dict?, len(args) checked?, len conditions)."""
        key_guarded = bounds = False
        conditions = []
        for holds, test in ctx.tests:
            for part in conjuncts(test) if holds else [test]:
                if not isinstance(part, ast.Compare) or len(part.ops) != 1:
                    continue
                comp, op = part.comparators[0], part.ops[0]
                if isinstance(comp, ast.Name) and comp.id in self.update_names:
                    key_guarded = key_guarded or isinstance(op, ast.In if holds else ast.NotIn)
                elif self._is_args_len(part.left):
                    bounds = True
                    conditions.append(_len_condition(op, comp, holds))
        return key_guarded, bounds, conditions

    def _is_args_len(self, node: ast.expr) -> bool:
        """``len(<record>.args)`` or ``len(<alias of the args>)``."""
        if not (isinstance(node, ast.Call) and dotted(node.func) == "len" and node.args):
            return False
        name = dotted(node.args[0]) or ""
        return name.endswith(".args") or name in self.arg_aliases

    def _pairs(self, w: _Write, op: str) -> list[tuple[Any, Any]]:
        """(index, key) of one write for ``op``, resolving names via bindings."""
        names = [v[1] for v in (w.index, w.key) if isinstance(v, tuple) and v[0] == "name"]
        if not names:
            return [(w.index, w.key)]
        out = []
        for bctx, bound in self.bindings:
            if bctx.applies_to(op) and all(n in bound for n in names):
                out.append(
                    tuple(
                        bound[v[1]] if isinstance(v, tuple) and v[0] == "name" else v
                        for v in (w.index, w.key)
                    )
                )
        if not out:
            raise ExtractionError(f"{self.where}: cannot resolve {names} for {op}")
        return out

    def per_op(self, op: str) -> dict[str, Any]:
        rules: set[str] = set()
        positional: list[dict[str, Any]] = []
        forced: list[dict[str, Any]] = []
        for w in self.writes:
            if not w.ctx.applies_to(op):
                continue
            key_guarded, bounds, conditions = self._guards(w.ctx)
            if w.kind == "kwargs_loop":
                assert w.rule is not None
                when = " and ".join(conditions)
                rules.add(f"{w.rule} if {when}" if when else w.rule)
                continue
            for index, key in self._pairs(w, op):
                if w.kind == "arg":
                    if not isinstance(index, int) or not isinstance(key, str):
                        raise ExtractionError(f"{self.where}: odd write args[{index!r}] = [{key!r}]")
                    positional.append(_positional(index, key, key_guarded, bounds))
                else:
                    forced.append({"name": index, "key": key})
        return {
            "kwargs_rule": " | ".join(sorted(rules)) if rules else None,
            "positional": _sorted_positional(positional),
            "forced_kwargs": _sorted_forced(forced),
        }


def _len_condition(op: ast.cmpop, comp: ast.expr, holds: bool) -> str:
    flip = {ast.GtE: "<", ast.Gt: "<=", ast.LtE: ">", ast.Lt: ">=", ast.Eq: "!=", ast.NotEq: "=="}
    keep = {ast.GtE: ">=", ast.Gt: ">", ast.LtE: "<=", ast.Lt: "<", ast.Eq: "==", ast.NotEq: "!="}
    symbol = (keep if holds else flip).get(type(op), "?")
    return f"len(args) {symbol} {ast.unparse(comp)}"


def _positional(index: int, key: str, key_guarded: bool, bounds: bool) -> dict[str, Any]:
    return {"index": index, "key": key, "key_guarded": key_guarded, "bounds_checked": bounds}


def _sorted_positional(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    unique = {json.dumps(e, sort_keys=True): e for e in entries}
    return sorted(unique.values(), key=lambda e: (e["index"], e["key"], json.dumps(e, sort_keys=True)))


def _sorted_forced(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    unique = {json.dumps(e, sort_keys=True): e for e in entries}
    return sorted(unique.values(), key=lambda e: (str(e["name"]), str(e["key"])))


@dataclass
class _Sources:
    trees: dict[str, ast.Module]

    def classes(self, prefix: str) -> dict[str, tuple[str, ast.ClassDef]]:
        out = {}
        for path, tree in sorted(self.trees.items()):
            if path.startswith(prefix):
                for node in tree.body:
                    if isinstance(node, ast.ClassDef):
                        out[node.name] = (path, node)
        return out


def _mro(name: str, classes: dict[str, tuple[str, ast.ClassDef]]) -> list[ast.ClassDef]:
    chain = []
    seen = set()
    todo = [name]
    while todo:
        current = todo.pop(0)
        if current in seen or current not in classes:
            continue
        seen.add(current)
        cls = classes[current][1]
        chain.append(cls)
        todo.extend((dotted(b) or "").split(".")[-1] for b in cls.bases)
    return chain


def _lookup_method(mro: list[ast.ClassDef], name: str) -> ast.FunctionDef | None:
    for cls in mro:
        fn = methods_of(cls).get(name)
        if fn is not None:
            return fn
    return None


def _lookup_dict_attr(mro: list[ast.ClassDef], name: str) -> ast.Dict | None:
    for cls in mro:
        for node in cls.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets
            ):
                return node.value if isinstance(node.value, ast.Dict) else None
    return None


def _handler_positional(
    handler: str, op: str, classes: dict[str, tuple[str, ast.ClassDef]], where: str
) -> dict[str, Any]:
    """What ``handler.update_args`` does to a record of ``op``."""
    mro = _mro(handler, classes)
    fn = _lookup_method(mro, "update_args")
    if fn is None:
        return {"kwargs_rule": None, "positional": [], "forced_kwargs": []}
    # Follow cls.<method>() calls to find a class-level spec dict.
    seen: set[str] = set()
    todo = [fn]
    spec_attrs: list[str] = []
    body_nodes: list[ast.AST] = []
    while todo:
        current = todo.pop()
        if current.name in seen:
            continue
        seen.add(current.name)
        body_nodes.append(current)
        for node in ast.walk(current):
            if isinstance(node, ast.Attribute) and dotted(node.value) == "cls":
                if _lookup_dict_attr(mro, node.attr) is not None:
                    spec_attrs.append(node.attr)
                callee = _lookup_method(mro, node.attr)
                if callee is not None:
                    todo.append(callee)
    update_param = fn.args.args[2].arg if len(fn.args.args) > 2 else "update_input"
    if not spec_attrs:
        walker = _UpdateWalker({update_param}, f"{where}:{handler}.update_args")
        walker.walk(fn.body, _Ctx())
        return walker.per_op(op)
    key_guarded = bounds = False
    for root in body_nodes:
        for node in ast.walk(root):
            if isinstance(node, ast.Compare) and len(node.ops) == 1:
                comp = node.comparators[0]
                if isinstance(comp, ast.Name) and comp.id == update_param:
                    key_guarded = key_guarded or isinstance(node.ops[0], (ast.In, ast.NotIn))
                if isinstance(node.left, ast.Call) and dotted(node.left.func) == "len":
                    bounds = True
                if any(isinstance(c, ast.Call) and dotted(c.func) == "len" for c in node.comparators):
                    bounds = True
    positional: list[dict[str, Any]] = []
    forced: list[dict[str, Any]] = []
    for attr in sorted(set(spec_attrs)):
        table = _lookup_dict_attr(mro, attr)
        assert table is not None
        for key_node, value_node in zip(table.keys, table.values, strict=True):
            if not (isinstance(key_node, ast.Constant) and key_node.value == op):
                continue
            value = ast.literal_eval(value_node)
            specs = [("arg", *value)] if isinstance(value, tuple) and len(value) == 2 else list(value)
            for loc, slot, key in specs:
                if loc == "arg":
                    positional.append(_positional(slot, key, key_guarded, bounds))
                elif loc == "kwarg":
                    forced.append({"name": slot, "key": key})
                else:
                    raise ExtractionError(f"{where}: unknown spec location {loc!r} in {handler}.{attr}")
    return {
        "kwargs_rule": None,
        "positional": _sorted_positional(positional),
        "forced_kwargs": _sorted_forced(forced),
    }


def analyse_update(src: _Sources) -> dict[str, Any]:
    tree = src.trees.get(GRAPHS)
    if tree is None:
        return {"present": False}
    _, classes = top_level(tree)
    npu_graph = classes.get("NPUGraph")
    update = methods_of(npu_graph).get("update") if npu_graph else None
    if npu_graph is None or update is None:
        return {"present": False}
    mode_cls = next((c for c in classes.values() if "__torch_dispatch__" in methods_of(c)), None)
    if mode_cls is None:
        raise ExtractionError("NPUGraph.update exists but no class has __torch_dispatch__")
    mode = methods_of(mode_cls)
    dispatch = mode["__torch_dispatch__"]
    func_param = dispatch.args.args[1].arg

    # which mode method does NPUGraph.update call, and on which attribute
    called = None
    mode_attr = None
    for node in ast.walk(update):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = dotted(node.func.value) or ""
            if node.func.attr in mode and owner.startswith("self."):
                called, mode_attr = node.func.attr, owner.split(".", 1)[1]
    if called is None:
        raise ExtractionError("NPUGraph.update does not call the dispatch mode")
    requires_flag = any(
        isinstance(n, ast.If)
        and isinstance(n.test, ast.UnaryOp)
        and isinstance(n.test.op, ast.Not)
        and dotted(n.test.operand) == "self.auto_dispatch_capture"
        and any(isinstance(s, ast.Raise) for s in n.body)
        for n in ast.walk(update)
    )
    record_fn = mode[called]
    cpu_param = record_fn.args.args[1].arg

    # registry or inline op names
    registry = None
    for node in ast.walk(dispatch):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            arg = node.args[0] if node.args else None
            if dotted(arg) == f"{func_param}.__name__" and isinstance(node.func.value, ast.Name):
                registry = node.func.value.id
    ops: dict[str, dict[str, Any]] = {}
    handler_classes = src.classes(HANDLERS_DIR)
    registered: dict[str, str] = {}
    if registry is not None:
        registered = registered_handlers(src)
        if not registered:
            raise ExtractionError(f"dispatch uses {registry} but no handler is registered")
        checks_should_handle = "should_handle" in ast.unparse(dispatch)
        for op, handler in registered.items():
            mro = _mro(handler, handler_classes)
            prepare = _lookup_method(mro, "prepare_capture")
            recorded = _swap_target(prepare, op) if prepare else op
            ops[op] = {
                "recorded_as": recorded,
                "handler": handler,
                "should_handle": checks_should_handle and _lookup_method(mro, "should_handle") is not None,
            }
    else:
        for node in ast.walk(dispatch):
            if not isinstance(node, ast.If):
                continue
            names = op_name_test(node.test, func_param)
            if names is None:
                continue
            recorded = _branch_record(node.body, func_param)
            for op in names:
                ops[op] = {
                    "recorded_as": op if recorded == func_param else recorded,
                    "handler": None,
                    "should_handle": False,
                }
    if not ops:
        raise ExtractionError("no intercepted op found in __torch_dispatch__")

    walker = _UpdateWalker({"update_input"}, f"{GRAPHS}:{called}")
    walker.walk(record_fn.body, _Ctx())
    for entry in ops.values():
        recorded = entry["recorded_as"]
        if recorded is None:
            entry.update({"kwargs_rule": None, "positional": [], "forced_kwargs": []})
            continue
        facts = walker.per_op(recorded)
        if registry is not None and recorded in registered:
            extra = _handler_positional(registered[recorded], recorded, handler_classes, HANDLERS_DIR)
            facts["positional"] = _sorted_positional(facts["positional"] + extra["positional"])
            facts["forced_kwargs"] = _sorted_forced(facts["forced_kwargs"] + extra["forced_kwargs"])
        entry.update(facts)

    return {
        "present": True,
        "signature": signature(update),
        "requires_auto_dispatch_capture": requires_flag,
        "dispatch": "handler_registry" if registry else "inline",
        "length_check": _length_check(record_fn),
        "broadcasts_single_input": _broadcasts(record_fn, cpu_param),
        "update_stream": _update_stream(mode_cls),
        "records_attribute": f"{mode_attr}.{_records_attr(mode_cls)}",
        "ops": {op: ops[op] for op in sorted(ops)},
    }


def registered_handlers(src: _Sources) -> dict[str, str]:
    """``op name -> handler class`` from ``@register_npu_graph_handler([...])``."""
    out: dict[str, str] = {}
    for path, tree in sorted(src.trees.items()):
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for deco in node.decorator_list:
                if isinstance(deco, ast.Call) and (dotted(deco.func) or "").endswith(
                    "register_npu_graph_handler"
                ):
                    names = str_list(deco.args[0]) if deco.args else None
                    if names is None:
                        raise ExtractionError(f"{path}: non-literal handler registration on {node.name}")
                    for name in names:
                        out[name] = node.name
    return dict(sorted(out.items()))


def _swap_target(prepare: ast.FunctionDef, op: str) -> str:
    """The op a handler's ``prepare_capture`` returns for ``op``."""
    swaps = {}
    for node in ast.walk(prepare):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = dotted(node.value)
            if name and name.startswith("torch_npu."):
                swaps[node.targets[0].id] = name.split(".", 1)[1]
    returned = set()
    for node in ast.walk(prepare):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple) and node.value.elts:
            first = node.value.elts[0]
            if isinstance(first, ast.Name) and first.id in swaps:
                returned.add(swaps[first.id])
    if len(returned) > 1:
        raise ExtractionError(f"prepare_capture swaps to several ops: {sorted(returned)}")
    return returned.pop() if returned else op


def _branch_record(body: list[ast.stmt], func_param: str) -> str | None:
    """The op recorded by one ``__torch_dispatch__`` branch (None: not recorded)."""
    swaps = {}
    recorded = None
    for stmt in body:
        for node in ast.walk(stmt):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                name = dotted(node.value)
                if name and name.startswith("torch_npu."):
                    swaps[node.targets[0].id] = name.split(".", 1)[1]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr == "_append_dispatch_record" and node.args:
                    last = node.args[-1]
                    if isinstance(last, ast.Name):
                        recorded = func_param if last.id == func_param else swaps.get(last.id)
                        if recorded is None:
                            raise ExtractionError(f"cannot tell which op {last.id!r} is")
    return recorded


def _length_check(fn: ast.FunctionDef) -> str:
    for node in ast.walk(fn):
        if not (isinstance(node, ast.If) and any(isinstance(s, ast.Raise) for s in node.body)):
            continue
        test = node.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.NotEq):
            sides = [test.left, test.comparators[0]]
            if all(isinstance(s, ast.Call) and dotted(s.func) == "len" for s in sides):
                left, right = (ast.unparse(s) for s in sides)
                return "compares_records_with_itself" if left == right else "raises_on_mismatch"
    return "absent"


def _broadcasts(fn: ast.FunctionDef, cpu_param: str) -> bool:
    for node in ast.walk(fn):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Call):
            if dotted(node.left.func) == "len" and node.left.args and dotted(node.left.args[0]) == cpu_param:
                comp = node.comparators[0]
                if isinstance(comp, ast.Constant) and comp.value == 1:
                    return True
    return False


def _update_stream(mode_cls: ast.ClassDef) -> str | None:
    for name, fn in methods_of(mode_cls).items():
        if name not in ("__init__", "__new__"):
            continue
        for node in ast.walk(fn):
            for target in _assign_targets(node):
                if isinstance(target, ast.Attribute) and "stream" in target.attr:
                    owner = dotted(target.value)
                    if owner == "self":
                        return "per_instance"
                    if owner == "cls":
                        return "class_level"
    return None


def _records_attr(mode_cls: ast.ClassDef) -> str | None:
    init = methods_of(mode_cls).get("__init__")
    for node in ast.walk(init) if init else []:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and dotted(target.value) == "self":
                    return target.attr
    return None


# --------------------------------------------------------------------------
# the other sections


def analyse_graph_api(src: _Sources) -> dict[str, Any]:
    tree = src.trees.get(GRAPHS)
    if tree is None:
        return {
            "present": False,
            "all": None,
            "graph_enter_calls": [],
            "functions": {},
            "classes": {},
        }
    funcs, classes = top_level(tree)
    enter = methods_of(classes["graph"]).get("__enter__") if "graph" in classes else None
    return {
        "present": "NPUGraph" in classes,
        "all": literal_all(tree),
        "graph_enter_calls": _statement_calls(enter.body) if enter else [],
        "functions": {n: signature(f) for n, f in sorted(funcs.items()) if not n.startswith("_")},
        "classes": {n: class_summary(c) for n, c in sorted(classes.items())},
    }


def _statement_calls(body: list[ast.stmt], when: str | None = None) -> list[dict[str, Any]]:
    """Calls made as statements, in source order, with the guarding test (if any)."""
    out: list[dict[str, Any]] = []
    for stmt in body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            name = dotted(stmt.value.func)
            if name and name.split(".")[0] not in ("log", "logger", "logging"):
                out.append({"call": name, "when": when})
        elif isinstance(stmt, ast.If):
            test = dotted(stmt.test) or "<expr>"
            out += _statement_calls(stmt.body, test)
            out += _statement_calls(stmt.orelse, f"not {test}")
    return out


def analyse_streams(src: _Sources) -> dict[str, Any]:
    tree = src.trees.get(STREAMS)
    _, classes = top_level(tree) if tree else ({}, {})
    return {"classes": {n: class_summary(c) for n, c in sorted(classes.items())}}


def analyse_exports(src: _Sources) -> dict[str, Any]:
    tree = src.trees.get(NPU_INIT)
    if tree is None:
        return {}
    listed = set(literal_all(tree) or [])
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module in EXPORT_MODULES:
            for alias in node.names:
                name = alias.asname or alias.name
                out[name] = {"from": f".{node.module}", "in_all": name in listed}
    return dict(sorted(out.items()))


def analyse_auto_dispatch(src: _Sources, mentioning: list[str]) -> dict[str, Any]:
    locations: set[str] = set()
    index = None
    tree = src.trees.get(GRAPHS)
    _, classes = top_level(tree) if tree else ({}, {})
    for cname, cls in sorted(classes.items()):
        for mname, fn in methods_of(cls).items():
            names = [p["name"] for p in signature(fn)["params"]]
            if "auto_dispatch_capture" in names:
                locations.add(f"{cname}.{mname}:param")
                if cname == "graph" and mname == "__init__":
                    index = names.index("auto_dispatch_capture") - 1
            for node in ast.walk(fn):
                for target in _assign_targets(node):
                    if isinstance(target, ast.Attribute) and target.attr == "auto_dispatch_capture":
                        if dotted(target.value) == "self":
                            locations.add(f"{cname}.{mname}:attribute")
    return {
        "present": index is not None,
        "graph_init_index": index,
        "locations": sorted(locations),
        "files": mentioning,
    }


def analyse_task_group(src: _Sources) -> dict[str, Any]:
    tree = src.trees.get(GRAPHS)
    funcs, _ = top_level(tree) if tree else ({}, {})
    found = {n: signature(funcs[n]) for n in TASK_GROUP_FUNCTIONS if n in funcs}
    return {"present": len(found) == len(TASK_GROUP_FUNCTIONS), "functions": found}


def analyse_handlers(src: _Sources) -> dict[str, Any] | None:
    classes = src.classes(HANDLERS_DIR)
    if not classes:
        return None
    registered = registered_handlers(src)
    registry = None
    for path, tree in src.trees.items():
        if path.startswith(HANDLERS_DIR):
            for node in tree.body:
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
                    for t in node.targets:
                        if isinstance(t, ast.Name) and t.id.isupper():
                            registry = t.id
    out = {}
    for name, (path, cls) in sorted(classes.items()):
        mro = _mro(name, classes)
        hooks = sorted({m for c in mro for m in methods_of(c) if not m.startswith("__")})
        out[name] = {
            "file": path,
            "bases": [ast.unparse(b) for b in cls.bases],
            "ops": sorted(op for op, h in registered.items() if h == name),
            "hooks": hooks,
        }
    return {"registry": registry, "classes": out}


def _scan_binary(zf: zipfile.ZipFile, names: list[str]) -> dict[str, bool]:
    found = dict.fromkeys(BINARY_TOKENS, False)
    tokens = [t.encode() for t in BINARY_TOKENS]
    keep = max(len(t) for t in tokens)
    for name in names:
        if not (re.fullmatch(r"torch_npu/_C[^/]*\.so", name) or name == "torch_npu/lib/libtorch_npu.so"):
            continue
        tail = b""
        with zf.open(name) as fh:
            while chunk := fh.read(1 << 24):
                data = tail + chunk
                for token, raw in zip(BINARY_TOKENS, tokens, strict=True):
                    if not found[token] and raw in data:
                        found[token] = True
                tail = data[-keep:]
    return found


def _metadata(zf: zipfile.ZipFile, names: list[str]) -> list[str]:
    meta = next((n for n in names if n.endswith(".dist-info/METADATA")), None)
    if meta is None:
        return []
    msg = Parser().parsestr(zf.read(meta).decode("utf-8", "replace"))
    return msg.get_all("Requires-Dist") or []


def _version_py(tree: ast.Module | None) -> dict[str, str | None]:
    out: dict[str, str | None] = {"__version__": None, "git_version": None}
    for node in tree.body if tree else []:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for t in node.targets:
                if isinstance(t, ast.Name) and t.id in out:
                    out[t.id] = str(node.value.value)
    return out


def extract(wheel: Path, version: str) -> dict[str, Any]:
    """Build the manifest dict for one wheel (see the module docstring)."""
    digest = hashlib.sha256()
    with wheel.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    with zipfile.ZipFile(wheel) as zf:
        names = sorted(zf.namelist())
        wanted = [
            n
            for n in names
            if n in (GRAPHS, STREAMS, NPU_INIT, VERSION_PY)
            or (n.startswith(HANDLERS_DIR) and n.endswith(".py"))
        ]
        mentioning = []
        for name in names:
            if name.endswith(".py") and name.startswith("torch_npu/"):
                raw = zf.read(name)
                if b"auto_dispatch_capture" in raw:
                    mentioning.append(name)
                if b"register_npu_graph_handler" in raw and name not in wanted:
                    wanted.append(name)
        trees = {n: ast.parse(zf.read(n).decode("utf-8"), filename=n) for n in sorted(wanted)}
        info = zf.getinfo(VERSION_PY) if VERSION_PY in names else None
        build_date = "{:04d}-{:02d}-{:02d}".format(*info.date_time[:3]) if info else None
        binary = _scan_binary(zf, names)
        requires = _metadata(zf, names)
    src = _Sources(trees)
    files = {p: any(n.startswith(p) for n in names) if p.endswith("/") else p in names for p in TRACKED_PATHS}
    return {
        "schema": SCHEMA,
        "version": version,
        "wheel": {
            "filename": wheel.name,
            "sha256": digest.hexdigest(),
            "size": wheel.stat().st_size,
            "build_date": build_date,
            "requires_dist": requires,
        },
        "version_py": _version_py(trees.get(VERSION_PY)),
        "files": files,
        "binary_strings": binary,
        "graph_api": analyse_graph_api(src),
        "streams": analyse_streams(src),
        "npu_exports": analyse_exports(src),
        "auto_dispatch_capture": analyse_auto_dispatch(src, mentioning),
        "task_group_api": analyse_task_group(src),
        "handlers": analyse_handlers(src),
        "update": analyse_update(src),
    }


def dumps(manifest: dict[str, Any]) -> str:
    return json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=True) + "\n"


def manifest_path(directory: Path, version: str) -> Path:
    return directory / f"torch_npu-{version}.json"


# --------------------------------------------------------------------------
# generation facts and the table in vendor_graph/vendors/ascend/releases.py


def facts_from_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """The per-generation facts (``ascend_versions.GENERATION_FACTS`` shape)."""
    update = manifest["update"]
    present = update["present"]
    ops = update.get("ops", {})
    guarded = {e["key_guarded"] for op in ops.values() for e in op["positional"]}
    stream_classes = manifest["streams"]["classes"]
    return {
        "graph_api": manifest["graph_api"]["present"],
        "update": present,
        "auto_dispatch_capture": manifest["auto_dispatch_capture"]["present"],
        "task_group_api": manifest["task_group_api"]["present"],
        "external_event": "ExternalEvent" in stream_classes,
        "external_stream": "ExternalStream" in stream_classes,
        "handler_registry": present and update["dispatch"] == "handler_registry",
        "debug_dump": "debug_dump" in manifest["graph_api"]["classes"].get("NPUGraph", {}).get("methods", {}),
        "update_length_check": update.get("length_check"),
        "positional_key_guarded": guarded.pop() if len(guarded) == 1 else None,
        "update_ops": {
            name: {
                "recorded_as": op["recorded_as"],
                "kwargs": op["kwargs_rule"],
                "args": tuple((e["index"], e["key"]) for e in op["positional"]),
                "should_handle": op["should_handle"],
            }
            for name, op in sorted(ops.items())
        },
    }


def load_module(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("_ascend_versions_for_tool", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and typing look it up
    spec.loader.exec_module(module)
    return module


def _dispatched(ops: dict[str, Any]) -> dict[str, Any]:
    """The op rules a call can reach: torch dispatches every call as ``<op>.<overload>`` (an ``OpOverload``'s
    ``__name__`` names its overload, ``.default`` included), so an entry for a bare op name never fires."""
    return {op: rule for op, rule in ops.items() if "." in op}


def nearest_generation(facts: dict[str, Any], generation_facts: dict[str, Any]) -> str | None:
    """For a pre-release whose facts match no generation: the newest generation it covers, i.e. whose every
    fact but ``update_ops`` it has, and every op rule a call can reach with the same rule.  What it has beyond
    that (more intercepted ops, bare-name entries) is no rule vendor_graph takes from the generation: the
    classification lists it (:func:`deciding`)."""
    found = None
    for name, gen in generation_facts.items():
        if any(facts[key] != value for key, value in gen.items() if key != "update_ops"):
            continue
        mine = _dispatched(facts["update_ops"])
        if all(mine.get(op) == rule for op, rule in _dispatched(gen["update_ops"]).items()):
            found = name
    return found


def classification(manifest: dict[str, Any], generation_facts: dict[str, Any]) -> tuple[str, bool]:
    """(generation, whether the wheel's facts are exactly that generation's).

    A release must match one generation exactly (else a new generation is due: ExtractionError).  A
    pre-release is a snapshot between trains: when it matches none exactly it takes the newest generation it
    covers (:func:`nearest_generation`)."""
    facts = facts_from_manifest(manifest)
    matches = [g for g, f in generation_facts.items() if f == facts]
    if len(matches) == 1:
        return matches[0], True
    if not matches:
        near = nearest_generation(facts, generation_facts) if is_prerelease(manifest["version"]) else None
        if near is not None:
            return near, False
        closest = min(
            generation_facts,
            key=lambda g: sum(generation_facts[g].get(k) != v for k, v in facts.items()),
        )
        diff = {k: v for k, v in facts.items() if generation_facts[closest].get(k) != v}
        raise ExtractionError(
            f"torch_npu {manifest['version']}: facts match no generation; "
            f"closest {closest}, differing: {json.dumps(diff, indent=1, default=list)}"
        )
    raise ExtractionError(f"torch_npu {manifest['version']}: ambiguous generation {matches}")


def classify(manifest: dict[str, Any], generation_facts: dict[str, Any]) -> str:
    return classification(manifest, generation_facts)[0]


# Where each generation fact is read from in a wheel, for people (deciding()); Markdown-safe.
FACT_PLACES = {
    "graph_api": "`NPUGraph` (`torch_npu/npu/graphs.py`)",
    "update": "`NPUGraph.update`",
    "auto_dispatch_capture": "`graph(auto_dispatch_capture=)`",
    "task_group_api": "`graph_task_group_begin/end`, `graph_task_update_begin/end`",
    "external_event": "`ExternalEvent` (`torch_npu/npu/streams.py`)",
    "external_stream": "`ExternalStream` (`torch_npu/npu/streams.py`)",
    "handler_registry": "update() by op handlers (`torch_npu/npu/_npugraph_handlers/`)",
    "debug_dump": "`NPUGraph.debug_dump`",
    "update_length_check": "update()'s length check",
    "positional_key_guarded": "update()'s `args[i]` writes check the key",
}


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return "`[" + ", ".join(f"{i}:{k}" for i, k in value) + "]`"
    return f"`{value}`"


def _ops_shown(ops: Iterable[str]) -> str:
    """```op{,.default,.out}``` for the overloads of each op (bare name first)."""
    families: dict[str, list[str]] = {}
    for op in sorted(ops):
        base, _, overload = op.partition(".")
        families.setdefault(base, []).append(f".{overload}" if overload else "")
    return ", ".join(f"`{base}{forms[0]}`" if len(forms) == 1 else f"`{base}{{{','.join(forms)}}}`"
                     for base, forms in families.items())


def facts_difference(facts: dict[str, Any], other: dict[str, Any], other_name: str) -> list[str]:
    """How a wheel's facts differ from generation ``other_name``'s, one phrase per fact (op rules grouped)."""
    def shown(key: str, value: Any) -> str:
        return "no writes" if key == "positional_key_guarded" and value is None else _shown(value)

    out = []
    for key, place in FACT_PLACES.items():
        if facts[key] != other[key]:
            out.append(f"{place}: {shown(key, facts[key])} ({other_name}: {shown(key, other[key])})")
    mine, theirs = facts["update_ops"], other["update_ops"]
    extra, missing = sorted(set(mine) - set(theirs)), sorted(set(theirs) - set(mine))
    if extra:
        out.append(f"update() intercepts {_ops_shown(extra)} ({other_name}: no)")
    if missing:
        out.append(f"update() does not intercept {_ops_shown(missing)} ({other_name}: does)")
    changed: dict[str, list[str]] = {}
    for op in sorted(set(mine) & set(theirs)):
        if mine[op] != theirs[op] and mine[op]["recorded_as"] is None:
            changed.setdefault(f"records nothing ({other_name}: records it)", []).append(op)
        elif mine[op] != theirs[op]:
            parts = [
                f"{field} {_shown(mine[op][field])} ({other_name}: {_shown(theirs[op][field])})"
                for field in ("recorded_as", "kwargs", "args", "should_handle")
                if mine[op][field] != theirs[op][field]
            ]
            changed.setdefault("; ".join(parts), []).append(op)
    for text, ops in changed.items():
        out.append(f"update() {_ops_shown(ops)}: {text}")
    return out


def deciding(
    manifest: dict[str, Any], generation_facts: dict[str, Any], release_generation: str | None
) -> list[str]:
    """The facts of a pre-release's wheel that decide its generation, for people: where the generation is
    older than ``release_generation`` (of the release it precedes), what it lacks of that one; else what sets
    it apart from the generation before (G0: after); and, when the match is not exact, how it differs from its
    own generation."""
    facts = facts_from_manifest(manifest)
    generation, exact = classification(manifest, generation_facts)
    names = list(generation_facts)
    out = []
    if not exact:
        own = facts_difference(facts, generation_facts[generation], generation)
        out += [f"not exactly {generation}: {text}" for text in own]
    against = release_generation
    if against is None or against == generation:
        index = names.index(generation)
        against = names[index - 1] if index else names[index + 1]
    out += facts_difference(facts, generation_facts[against], against)
    return out


def _string_lines(text: str, indent: str, width: int = 118) -> list[str]:
    """``text`` as a Python string literal, split into implicitly joined pieces that fit ``width``."""
    room = width - len(indent) - 3
    pieces, current = [], ""
    for word in re.split(r"(?<= )", text):
        if current and len(json.dumps(current + word)) > room:
            pieces.append(current)
            current = ""
        current += word
    pieces.append(current)
    return [indent + json.dumps(piece) for piece in pieces]


def render_table(
    rows: list[tuple[str, str, str | None, str]], evidence: dict[str, list[str]] | None = None
) -> str:
    """The generated section: ``PRERELEASES`` (the rows of pre-releases), ``PRERELEASE_DECIDING``
    (``evidence``) and ``RELEASES`` (the rows of releases), each in version order."""
    def row(fields: tuple[str, str, str | None, str]) -> str:
        return "    Release(" + ", ".join(json.dumps(f) if f is not None else "None" for f in fields) + "),"

    pre = [r for r in rows if is_prerelease(r[0])]
    lines = [
        TABLE_BEGIN + " (tools/torch_npu_manifest.py --write-table; do not edit)",
        "# source 'manifest': sim/vendor_graph_sim/data/torch_npu_manifests/torch_npu-<version>.json, read from the",
        "# wheel; source 'research': from torch_npu's source and notes, no manifest.",
        "# Every pre-release on PyPI, classified from its own wheel: a pre-release is a snapshot of an earlier",
        "# train than the release it precedes, often of an older generation.",
        "PRERELEASES: tuple[Release, ...] = (",
        *(row(r) for r in pre),
        ")",
        "# What decides each pre-release's generation, read from its wheel (tools/torch_npu_manifest.py deciding()):",
        "# what it lacks of its release's generation when older, else what sets it apart from the generation before.",
        "PRERELEASE_DECIDING: dict[str, tuple[str, ...]] = {",
    ]
    for version, texts in (evidence or {}).items():
        lines.append(f"    {json.dumps(version)}: (")
        for text in texts:
            pieces = _string_lines(text, " " * 8)
            pieces[-1] += ","
            lines += pieces
        lines.append("    ),")
    lines += [
        "}",
        "RELEASES: tuple[Release, ...] = (",
        *(row(r) for r in rows if not is_prerelease(r[0])),
        ")",
        TABLE_END,
    ]
    return "\n".join(lines)


def table_text(module_path: Path, manifests: Path) -> str:
    """The text ``module_path`` should have, its table rebuilt from ``manifests``.

    Rows come from the manifests; rows of the current table that are marked
    ``research`` and have no manifest are kept as they are.  Each pre-release
    with a manifest also gets what decides its generation (:func:`deciding`).
    """
    module = load_module(module_path)
    rows: dict[str, tuple[str, str, str | None, str]] = {}
    for release in (*module.RELEASES, *getattr(module, "PRERELEASES", ())):
        if release.source == "research":
            rows[release.version] = tuple(release)  # type: ignore[assignment]
    found = {}
    for path in sorted(manifests.glob("torch_npu-*.json")):
        manifest = json.loads(path.read_text())
        version = manifest["version"]
        found[version] = manifest
        generation = classify(manifest, module.GENERATION_FACTS)
        rows[version] = (version, generation, manifest["wheel"]["build_date"], "manifest")
    evidence = {}
    for version in sorted(found, key=version_key):
        if is_prerelease(version):
            release = rows.get(final_of(version))
            evidence[version] = deciding(found[version], module.GENERATION_FACTS, release[1] if release else None)
    ordered = [rows[v] for v in sorted(rows, key=version_key)]
    text = module_path.read_text()
    start = text.index(TABLE_BEGIN)
    end = text.index(TABLE_END) + len(TABLE_END)
    return text[:start] + render_table(ordered, evidence) + text[end:]


def write_table(module_path: Path, manifests: Path) -> bool:
    """Regenerate the table section in place; True if the file changed."""
    new = table_text(module_path, manifests)
    changed = new != module_path.read_text()
    if changed:
        module_path.write_text(new)
    return changed


# --------------------------------------------------------------------------
# command line


def _versions(args: argparse.Namespace) -> list[str]:
    if args.all:
        return list_pypi_versions()
    if args.new:
        return [v for v in list_pypi_versions() if not manifest_path(args.manifests, v).exists()]
    if args.versions:
        return args.versions
    if args.check:
        return sorted(
            (p.name[len("torch_npu-") : -len(".json")] for p in args.manifests.glob("torch_npu-*.json")),
            key=version_key,
        )
    return []


def _each(versions: list[str], args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    for version in versions:
        wheel = fetch_wheel(version, args.cache)
        text = dumps(extract(wheel, version))
        if args.delete_wheels:
            wheel.unlink()
        yield version, text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", nargs="+", metavar="V", help="releases to extract")
    parser.add_argument(
        "--all", action="store_true", help="every torch_npu version on PyPI, releases and pre-releases"
    )
    parser.add_argument(
        "--new", action="store_true", help="the versions on PyPI (releases and pre-releases) without a manifest"
    )
    parser.add_argument(
        "--check", action="store_true", help="re-extract and diff against the committed manifests"
    )
    parser.add_argument(
        "--write-table", action="store_true", help="regenerate the table in vendor_graph/vendors/ascend/releases.py"
    )
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="wheel cache (default %(default)s)")
    parser.add_argument("--manifests", type=Path, default=DEFAULT_MANIFESTS)
    parser.add_argument("--module", type=Path, default=DEFAULT_MODULE, help="ascend_versions.py to update")
    parser.add_argument("--delete-wheels", action="store_true", help="delete each wheel after extraction")
    args = parser.parse_args(argv)

    versions = _versions(args)
    if args.new and not versions and not args.write_table:
        print("every torch_npu version on PyPI has a manifest", file=sys.stderr)
        return 0
    if not versions and not args.write_table:
        parser.error("nothing to do: give --versions, --all, --new, --check or --write-table")
    try:
        return _run(args, versions)
    except ExtractionError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, versions: list[str]) -> int:
    status = 0
    for version, text in _each(versions, args):
        path = manifest_path(args.manifests, version)
        if args.check:
            old = path.read_text() if path.exists() else ""
            if old != text:
                status = 1
                sys.stdout.writelines(
                    difflib.unified_diff(
                        old.splitlines(True), text.splitlines(True), str(path), f"{version} (re-extracted)"
                    )
                )
            print(f"{version}: {'differs' if old != text else 'ok'}", file=sys.stderr)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"{version}: wrote {path}", file=sys.stderr)
    if args.write_table and args.check:
        old, new = args.module.read_text(), table_text(args.module, args.manifests)
        if old != new:
            status = 1
            sys.stdout.writelines(
                difflib.unified_diff(old.splitlines(True), new.splitlines(True), str(args.module), "table")
            )
        print(f"{args.module}: {'differs' if old != new else 'ok'}", file=sys.stderr)
    elif args.write_table:
        changed = write_table(args.module, args.manifests)
        print(f"{args.module}: {'updated' if changed else 'unchanged'}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
