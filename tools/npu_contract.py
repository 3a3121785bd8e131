"""vendor_graph's torch_npu API contract: every ``torch.npu`` / ``torch_npu`` use in the runtime source,
checked against the manifests of the real torch_npu releases (``sim/vendor_graph_sim/data/torch_npu_manifests/*.json``).

The scan reads ``vendor_graph`` (everything outside ``testing/``) with ``ast`` and finds each
attribute, method, keyword and positional-argument count the code uses on torch_npu objects:

* the module, reached as ``torch.npu``, ``torch_npu.npu`` or a holder of it (a local alias
  ``npu = torch.npu``, or a parameter/field declared in :data:`MODULE_HOLDERS`);
* the objects it makes (``NPUGraph()``, ``Event()``, ``ExternalEvent()``, ``Stream()``,
  ``current_stream()``), followed through assignments by expression text across the package
  (``npu_graph = npu.NPUGraph()``, ``graph.graph = npu_graph``, ``task.event = npu.ExternalEvent()``);
* ``**kwargs`` expanded from the dict the same function builds (literal keys and ``d["k"] = ...``).

A use runs on a release only when its guard lets it:

* ``hasattr(x, "name")`` around it, or ``getattr(x, "name", default)`` itself: a probe, never a failure;
* a capability test around it in the same function (``if caps.facts.get("auto_dispatch_capture")``);
* a capability guard elsewhere (the runner runs eager unless ``facts["graph_api"]``): declared in
  :data:`GUARDED_USES` with the function and test text that implement it, which the scan checks exist;
* a method of an object that only a guarded constructor makes (an ``NPUGraph`` exists only where
  ``NPUGraph`` does).

Each capability is evaluated on a manifest exactly as ``tools/torch_npu_manifest.py`` derives the
generation facts. Names the extractor does not record (torch_npu's ``torch.cuda``-mirror device API)
are declared in :data:`OUTSIDE_MANIFEST` with the reason.

``python tools/npu_contract.py`` prints every use and the releases it runs on; exit 1 on a violation.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "vendor_graph"
MANIFESTS = ROOT / "sim" / "vendor_graph_sim" / "data" / "torch_npu_manifests"
EXTRACTOR = ROOT / "tools" / "torch_npu_manifest.py"

MODULE = "torch.npu"
PACKAGE = "torch_npu"

# Parameters / fields that hold ``torch.npu`` (the scan cannot see through a call boundary).
# Each must still occur in the source (a stale entry fails the test).
MODULE_HOLDERS: dict[str, str] = {
    "npu": ("vendors/ascend/runner.py AscendGraphRunner._capture_into(npu=...) and vendors/ascend/hook.py "
            "CaptureScope.npu"),
    "self.npu": "vendors/ascend/hook.py CaptureScope.npu, set by the runner to torch.npu",
    "self._npu": "vendors/ascend/runner.py AscendGraphRunner._npu, from npu_runtime()",
    "npu_module": "vendors/ascend/seqlen.py probe_facts(npu_module) / detect(npu_module): torch.npu",
}

# What the module's constructors / functions return, and typed attributes of objects.
RETURNS: dict[tuple[str, str], str] = {
    (MODULE, "NPUGraph"): "NPUGraph",
    (MODULE, "Event"): "Event",
    (MODULE, "ExternalEvent"): "ExternalEvent",
    (MODULE, "Stream"): "Stream",
    (MODULE, "current_stream"): "Stream",
    ("NPUGraph", "graph_dispatch_mode"): "_GraphDispatchMode",
    (PACKAGE, "npu"): MODULE,
}

# torch.npu names the extractor does not record (it reads graphs.py and streams.py only). These are
# torch_npu's torch.cuda-mirror device API, present in every torch_npu release (torch_npu/npu/utils.py).
OUTSIDE_MANIFEST: dict[str, str] = {
    "current_stream": "torch.cuda mirror (torch_npu/npu/utils.py), every release",
    "stream": "torch.cuda mirror context manager (torch_npu/npu/utils.py), every release",
    "empty_cache": "torch.cuda mirror (torch_npu/npu/memory.py), every release",
}


def _capability(name: str):
    def check(facts: dict[str, Any]) -> bool:
        return all(bool(facts.get(part)) for part in name.split("+"))

    return check


# Uses guarded by a capability test that is not lexically around them. key -> (capability, function
# qualname that holds the test, text the test contains). Capabilities are generation facts
# (tools/torch_npu_manifest.py facts_from_manifest); "a+b" means both.
GUARDED_USES: dict[str, tuple[str, str, str]] = {
    "torch.npu.NPUGraph": ("graph_api", "AscendGraphRunner.capture", "caps.facts.get('graph_api')"),
    "torch.npu.graph": ("graph_api", "AscendGraphRunner.capture", "caps.facts.get('graph_api')"),
    "torch.npu.graph_pool_handle": ("graph_api", "AscendGraphRunner.capture", "caps.facts.get('graph_api')"),
    # GRAPH_UPDATE tasks exist only where seqlen.path_for saw facts["update"].
    "NPUGraph.update": ("update", "path_for", "facts.get('update')"),
    # TASK_UPDATE tasks exist only where path_for saw both (CaptureScope.path re-checks the first).
    "torch.npu.ExternalEvent": ("task_group_api+external_event", "path_for",
                                "facts.get('task_group_api') and facts.get('external_event')"),
    "torch.npu.graph_task_group_begin": ("task_group_api+external_event", "path_for",
                                         "facts.get('task_group_api') and facts.get('external_event')"),
    "torch.npu.graph_task_group_end": ("task_group_api+external_event", "path_for",
                                       "facts.get('task_group_api') and facts.get('external_event')"),
    "torch.npu.graph_task_update_begin": ("task_group_api+external_event", "path_for",
                                          "facts.get('task_group_api') and facts.get('external_event')"),
    "torch.npu.graph_task_update_end": ("task_group_api+external_event", "path_for",
                                        "facts.get('task_group_api') and facts.get('external_event')"),
}

_FACT_TEST = re.compile(r"facts(?:\.get\(|\[)'(\w+)'")
# Names that read as "the npu module" (npu, _npu, my_npu, torch_npu, npu_module): each must be tracked.
# Names where npu qualifies something else (npu_version, npu_graph, npu_runtime) are not holders.
_NPU_WORD = re.compile(r"(?:^|_)npu(?:_mod(?:ule)?)?$", re.IGNORECASE)


@dataclass
class Use:
    owner: str  # MODULE, PACKAGE or a class name
    name: str
    file: str
    line: int
    function: str
    keywords: tuple[str, ...] = ()
    positional: int | None = None  # None: not a call, or *args
    probe: bool = False  # hasattr / getattr with a default
    guards: tuple[str, ...] = ()  # enclosing if-tests (unparsed)
    keyword_guards: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)  # (keyword, its guards)
    receiver: str = ""  # source text of the object the attribute is read from

    @property
    def hasattr_guarded(self) -> bool:
        probe = f"hasattr({self.receiver}, '{self.name}')"
        return any(probe in g for g in self.guards if not g.startswith("not ("))

    @property
    def key(self) -> str:
        return f"{self.owner}.{self.name}"

    def where(self) -> str:
        return f"{self.file}:{self.line} ({self.function})"


def runtime_files(source: Path = SOURCE) -> list[Path]:
    return sorted(p for p in source.rglob("*.py") if "testing" not in p.relative_to(source).parts)


class _Functions(ast.NodeVisitor):
    """Qualified names of every function and the text of the if-tests inside it."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.tests: dict[str, list[str]] = {}

    def _fn(self, node) -> None:
        self.stack.append(node.name)
        name = ".".join(self.stack)
        self.tests.setdefault(name, [])
        for sub in ast.walk(node):
            if isinstance(sub, ast.If | ast.IfExp | ast.While | ast.Assert):
                self.tests[name].append(ast.unparse(sub.test))
            elif isinstance(sub, ast.Return) and sub.value is not None:
                self.tests[name].append(ast.unparse(sub.value))
        self.generic_visit(node)
        self.stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _fn

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()


class Scanner:
    def __init__(self, files: Iterable[Path], root: Path) -> None:
        self.trees = {str(p.relative_to(root)): ast.parse(p.read_text(), str(p)) for p in files}
        self.types: dict[str, str] = dict.fromkeys(MODULE_HOLDERS, MODULE)
        self.package_names: set[str] = set()
        self.functions: dict[str, list[str]] = {}
        self.uses: list[Use] = []
        self.unclassified: list[str] = []
        for tree in self.trees.values():
            v = _Functions()
            v.visit(tree)
            for name, tests in v.tests.items():
                self.functions.setdefault(name, []).extend(tests)
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    self.package_names |= {a.asname or a.name for a in node.names if a.name == PACKAGE}
        self._infer_types()
        for name, tree in self.trees.items():
            self._walk(tree, name, "<module>", (), {})
        self._classify_names()

    # -- types ---------------------------------------------------------------------------------

    def type_of(self, node: ast.AST | None) -> str | None:
        if node is None:
            return None
        if isinstance(node, ast.Name) and node.id in self.package_names:
            return PACKAGE
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch" \
                and node.attr == "npu":
            return MODULE
        text = ast.unparse(node)
        if text in self.types:
            return self.types[text]
        if isinstance(node, ast.Attribute):
            return RETURNS.get((self.type_of(node.value), node.attr)) if self.type_of(node.value) else None
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute):
                owner = self.type_of(node.func.value)
                return RETURNS.get((owner, node.func.attr)) if owner else None
            if isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) >= 2:
                owner, name = self.type_of(node.args[0]), node.args[1]
                if owner and isinstance(name, ast.Constant):
                    return RETURNS.get((owner, name.value), f"{owner}.{name.value}" if owner == MODULE else None)
        return None

    def _infer_types(self) -> None:
        changed = True
        while changed:
            changed = False
            for tree in self.trees.values():
                for node in ast.walk(tree):
                    if isinstance(node, ast.Assign) and len(node.targets) == 1:
                        target, value = node.targets[0], node.value
                    elif isinstance(node, ast.AnnAssign) and node.value is not None:
                        target, value = node.target, node.value
                    else:
                        continue
                    kind = self.type_of(value)
                    text = ast.unparse(target)
                    if kind and self.types.get(text) != kind and isinstance(target, ast.Name | ast.Attribute):
                        self.types[text] = kind
                        changed = True

    # -- uses ----------------------------------------------------------------------------------

    def _walk(self, node: ast.AST, file: str, function: str, guards: tuple[str, ...],
              kwargs_dicts: dict[str, dict[str, tuple[str, ...]]]) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = node.name if function == "<module>" else f"{function}.{node.name}"
            dicts = self._kwargs_dicts(node)
            for child in node.body:
                self._walk(child, file, name, (), dicts)
            return
        if isinstance(node, ast.ClassDef):
            prefix = node.name if function == "<module>" else f"{function}.{node.name}"
            for child in node.body:
                self._walk(child, file, prefix, guards, kwargs_dicts)
            return
        if isinstance(node, ast.If):
            self._walk(node.test, file, function, guards, kwargs_dicts)
            for child in node.body:
                self._walk(child, file, function, (*guards, ast.unparse(node.test)), kwargs_dicts)
            for child in node.orelse:
                self._walk(child, file, function, (*guards, f"not ({ast.unparse(node.test)})"), kwargs_dicts)
            return
        if isinstance(node, ast.Call):
            self._call(node, file, function, guards, kwargs_dicts)
        elif isinstance(node, ast.Attribute):
            self._attribute(node, file, function, guards, call=None, kwargs_dicts=kwargs_dicts)
        for child in ast.iter_child_nodes(node):
            if isinstance(node, ast.Call) and child is node.func and isinstance(child, ast.Attribute):
                for grandchild in ast.iter_child_nodes(child):  # the callee itself was recorded by _call
                    self._walk(grandchild, file, function, guards, kwargs_dicts)
                continue
            self._walk(child, file, function, guards, kwargs_dicts)

    def _kwargs_dicts(self, fn: ast.AST) -> dict[str, dict[str, tuple[str, ...]]]:
        """name -> {key: guards} for dicts a function builds that it may pass as ``**name``."""
        found: dict[str, dict[str, tuple[str, ...]]] = {}

        def visit(node: ast.AST, guards: tuple[str, ...]) -> None:
            if isinstance(node, ast.If):
                for child in node.body:
                    visit(child, (*guards, ast.unparse(node.test)))
                for child in node.orelse:
                    visit(child, (*guards, f"not ({ast.unparse(node.test)})"))
                return
            target = value = None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign):
                target, value = node.target, node.value
            if isinstance(target, ast.Name) and isinstance(value, ast.Dict):
                keys = found.setdefault(target.id, {})
                for key in value.keys:
                    keys[key.value if isinstance(key, ast.Constant) else "**?"] = guards
            if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                key = target.slice
                found.setdefault(target.value.id, {})[key.value if isinstance(key, ast.Constant) else "**?"] = guards
            for child in ast.iter_child_nodes(node):
                if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    visit(child, guards)

        for child in fn.body:
            visit(child, ())
        return found

    def _call(self, node: ast.Call, file, function, guards, kwargs_dicts) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("hasattr", "getattr") and len(node.args) >= 2:
            owner = self.type_of(node.args[0])
            name = node.args[1]
            if owner:
                if not isinstance(name, ast.Constant):
                    return  # hasattr(npu, n) over a list: a probe whatever n is
                probe = func.id == "hasattr" or len(node.args) == 3
                self.uses.append(Use(owner, name.value, file, node.lineno, function, probe=probe, guards=guards,
                                     receiver=ast.unparse(node.args[0])))
            return
        if isinstance(func, ast.Attribute):
            self._attribute(func, file, function, guards, call=node, kwargs_dicts=kwargs_dicts)

    def _attribute(self, node: ast.Attribute, file, function, guards, call, kwargs_dicts) -> None:
        owner = self.type_of(node.value)
        if owner is None or node.attr.startswith("__"):
            return
        if ast.unparse(node) in self.types and call is None and self.types[ast.unparse(node)] == MODULE:
            return  # a holder of the module (self._npu), not a use
        use = Use(owner, node.attr, file, node.lineno, function, guards=guards, receiver=ast.unparse(node.value))
        if call is not None:
            keyword_guards: list[tuple[str, tuple[str, ...]]] = []
            for kw in call.keywords:
                if kw.arg is not None:
                    keyword_guards.append((kw.arg, ()))
                elif isinstance(kw.value, ast.Name) and kw.value.id in kwargs_dicts:
                    keyword_guards.extend(kwargs_dicts[kw.value.id].items())
                else:
                    keyword_guards.append(("**?", ()))  # unresolvable: no release declares it, so it fails
            starred = any(isinstance(a, ast.Starred) for a in call.args)
            use.keywords = tuple(k for k, _ in keyword_guards)
            use.keyword_guards = keyword_guards
            use.positional = None if starred else len(call.args)
        self.uses.append(use)

    def _classify_names(self) -> None:
        """Identifiers that look like torch_npu holders but that the scan does not track."""
        known = set(self.types) | self.package_names
        for file, tree in self.trees.items():
            for node in ast.walk(tree):
                if isinstance(node, ast.Name | ast.Attribute | ast.arg):
                    word = node.id if isinstance(node, ast.Name) else node.attr if isinstance(
                        node, ast.Attribute) else node.arg
                    text = word if isinstance(node, ast.arg) else ast.unparse(node)
                    if not _NPU_WORD.search(word) or text in known or word in known:
                        continue
                    if isinstance(node, ast.Attribute) and self.type_of(node.value):
                        continue  # an attribute use (npu.NPUGraph), recorded
                    if word in NOT_HOLDERS:
                        continue
                    self.unclassified.append(f"{file}:{node.lineno}: {text}")


# Identifiers that read as an npu module (see _NPU_WORD) but hold something else: name -> what it holds.
NOT_HOLDERS: dict[str, str] = {
    "POST_350_MIN_TORCH_NPU": "the lowest torch_npu version post-#350 dlinfer accepts (a string)",
}


# -- the contract ----------------------------------------------------------------------------------


def load_manifests(directory: Path = MANIFESTS) -> dict[str, dict[str, Any]]:
    manifests = {}
    for path in sorted(directory.glob("torch_npu-*.json")):
        manifest = json.loads(path.read_text())
        manifests[manifest["version"]] = manifest
    return manifests


def load_extractor() -> Any:
    spec = importlib.util.spec_from_file_location("_vg_contract_extractor", EXTRACTOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _classes(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {**manifest["streams"]["classes"], **manifest["graph_api"]["classes"]}


def _functions(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {**manifest["graph_api"].get("functions", {}), **manifest["task_group_api"].get("functions", {})}


def exists(manifest: dict[str, Any], owner: str, name: str) -> bool | None:
    """Whether ``owner.name`` exists in the release (None: outside what the manifest records)."""
    if owner == PACKAGE:
        if name == "__version__":
            return bool(manifest["version_py"].get("__version__"))
        return True if name == "npu" else None
    if owner == MODULE:
        if name in manifest["npu_exports"]:
            return True
        return None if name in OUTSIDE_MANIFEST else False
    cls = _classes(manifest).get(owner)
    if cls is None:
        return False
    return name in cls["methods"] or name in cls["instance_attributes"] or name in cls["class_attributes"]


def params_of(manifest: dict[str, Any], owner: str, name: str) -> list[dict[str, Any]] | None:
    """Parameters (without self/cls) of the callable ``owner.name`` in the release, if recorded."""
    if owner == MODULE:
        cls = _classes(manifest).get(name)
        if cls is not None:
            method = cls["methods"].get("__init__") or cls["methods"].get("__new__")
            return method["params"][1:] if method else None
        fn = _functions(manifest).get(name)
        return fn["params"] if fn else None
    cls = _classes(manifest).get(owner)
    method = cls["methods"].get(name) if cls else None
    return method["params"][1:] if method else None


def call_problem(params: list[dict[str, Any]], keywords: Iterable[str], positional: int | None) -> str | None:
    kinds = {p["kind"] for p in params}
    named = {p["name"] for p in params if p["kind"] in ("positional_or_keyword", "keyword_only")}
    missing = [k for k in keywords if k not in named and "var_keyword" not in kinds]
    if missing:
        return f"no keyword {', '.join(missing)} (takes {sorted(named)})"
    slots = sum(p["kind"] in ("positional_only", "positional_or_keyword") for p in params)
    if positional is not None and positional > slots and "var_positional" not in kinds:
        return f"{positional} positional arguments, takes {slots}"
    return None


def _guard_capabilities(guards: Iterable[str]) -> set[str]:
    """Capabilities an enclosing test requires: the non-negated ``facts.get('x')`` / ``facts['x']``
    conjuncts of each if-test (an ``or``, a ``not`` or an else-branch guarantees nothing)."""
    caps: set[str] = set()
    for text in guards:
        if text.startswith("not ("):
            continue
        tree = ast.parse(text, mode="eval").body
        conjuncts = tree.values if isinstance(tree, ast.BoolOp) and isinstance(tree.op, ast.And) else [tree]
        for node in conjuncts:
            if isinstance(node, ast.Call | ast.Subscript):
                caps |= set(_FACT_TEST.findall(ast.unparse(node)))
    return caps


@dataclass
class Violation:
    use: Use
    what: str
    versions: list[str]

    def __str__(self) -> str:
        shown = ", ".join(self.versions[:6]) + (f" (+{len(self.versions) - 6} more)" if len(self.versions) > 6 else "")
        return (f"{self.use.where()}: {self.what} is missing from torch_npu {shown}. Guard it with a capability "
                f"probe (hasattr, or a facts check that GUARDED_USES in tools/npu_contract.py declares), or "
                f"drop it.")


class Contract:
    def __init__(self, source: Path = SOURCE, manifests: Path = MANIFESTS, root: Path | None = None) -> None:
        root = root or source.parents[1]
        self.scanner = Scanner(runtime_files(source), root)
        self.manifests = load_manifests(manifests)
        extractor = load_extractor()
        self.facts = {v: extractor.facts_from_manifest(m) for v, m in self.manifests.items()}

    @property
    def uses(self) -> list[Use]:
        return self.scanner.uses

    def constructor_capability(self, cls: str) -> str | None:
        for (owner, name), made in RETURNS.items():
            if made == cls and owner == MODULE and f"{MODULE}.{name}" in GUARDED_USES:
                return GUARDED_USES[f"{MODULE}.{name}"][0]
        return None

    def runs_on(self, use: Use, extra_guards: Iterable[str] = ()) -> list[str]:
        """The releases on which ``use`` (or one of its keywords, with ``extra_guards``) can run."""
        needed = set(_guard_capabilities((*use.guards, *extra_guards)))
        if use.key in GUARDED_USES:
            needed.add(GUARDED_USES[use.key][0])
        if use.owner not in (MODULE, PACKAGE):
            made_by = self.constructor_capability(use.owner)
            if made_by:
                needed.add(made_by)
        versions = []
        for version, facts in self.facts.items():
            if use.owner not in (MODULE, PACKAGE) and use.owner not in _classes(self.manifests[version]):
                continue  # no such object on this release
            if all(_capability(cap)(facts) for cap in needed):
                versions.append(version)
        return versions

    def violations(self) -> list[Violation]:
        found = []
        for use in self.uses:
            if use.probe:
                continue
            if use.hasattr_guarded:
                continue
            where = self.runs_on(use)
            lacking = [v for v in where if exists(self.manifests[v], use.owner, use.name) is False]
            unknown = [v for v in where if exists(self.manifests[v], use.owner, use.name) is None]
            if lacking:
                found.append(Violation(use, use.key, lacking))
                continue
            if unknown and use.owner == MODULE and use.name not in OUTSIDE_MANIFEST:
                found.append(Violation(use, f"{use.key} (not recorded by the extractor)", unknown))
            if use.positional is None and not use.keywords:
                continue
            for keyword, keyword_guards in (*use.keyword_guards, (None, ())):
                runs = self.runs_on(use, keyword_guards) if keyword else where
                bad = []
                for version in runs:
                    params = params_of(self.manifests[version], use.owner, use.name)
                    if params is None:
                        continue
                    problem = call_problem(params, [keyword] if keyword else [],
                                           use.positional if keyword is None else None)
                    if problem:
                        bad.append(version)
                        what = f"{use.key}({keyword}=)" if keyword else f"{use.key}: {problem}"
                if bad:
                    found.append(Violation(use, what, bad))
        return found

    def stale(self) -> list[str]:
        """Declarations that no longer match the source."""
        problems = []
        keys = {u.key for u in self.uses}
        for key, (_cap, function, text) in GUARDED_USES.items():
            if key not in keys:
                problems.append(f"GUARDED_USES[{key!r}]: the source no longer uses it; remove the entry")
            tests = [t for name, ts in self.scanner.functions.items()
                     if name == function or name.endswith("." + function) for t in ts]
            if not tests:
                problems.append(f"GUARDED_USES[{key!r}]: function {function} not found")
            elif not any(text in t for t in tests):
                problems.append(f"GUARDED_USES[{key!r}]: {function} no longer tests {text!r}: the use is unguarded")
        texts = {ast.unparse(n) for tree in self.scanner.trees.values() for n in ast.walk(tree)
                 if isinstance(n, ast.Name | ast.Attribute | ast.arg) and not isinstance(n, ast.arg)}
        texts |= {n.arg for tree in self.scanner.trees.values() for n in ast.walk(tree) if isinstance(n, ast.arg)}
        for holder in MODULE_HOLDERS:
            if holder not in texts:
                problems.append(f"MODULE_HOLDERS[{holder!r}] no longer occurs in the source; remove it")
        used = {u.name for u in self.uses if u.owner == MODULE}
        for name in OUTSIDE_MANIFEST:
            if name not in used:
                problems.append(f"OUTSIDE_MANIFEST[{name!r}] is no longer used; remove it")
        return problems

    def report(self) -> Iterator[str]:
        for use in sorted(self.uses, key=lambda u: (u.key, u.file, u.line)):
            runs = self.runs_on(use)
            kw = f"({', '.join(use.keywords)})" if use.keywords else ""
            tag = "probe" if use.probe else "hasattr-guarded" if use.hasattr_guarded else \
                f"runs on {len(runs)}/{len(self.manifests)}"
            yield f"{use.key + kw:<56} {tag:<16} {use.where()}"


def main() -> int:
    contract = Contract()
    for line in contract.report():
        print(line)
    problems = [str(v) for v in contract.violations()] + contract.stale() + [
        f"{u}: looks like a torch_npu holder; declare it in MODULE_HOLDERS or NOT_HOLDERS"
        for u in contract.scanner.unclassified]
    for problem in problems:
        print("VIOLATION:", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
