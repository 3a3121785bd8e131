"""The command outputs the documents show, generated and checked.

A sample sits in a document (README.md, docs/*.md) as::

    <!-- sample: NAME -->
    ```console
    $ vendor-graph demo
    ...its output...
    ```
    <!-- /sample -->

Each is run as ``python -m vendor_graph ARGS`` with this interpreter, in the repository root, with no
``VENDOR_GRAPH_*`` variable set but, for the samples that serve lmdeploy's engine, ``VENDOR_GRAPH_DLINFER_SRC``
(:func:`dlinfer_source`: as set, else the snapshot beside the clone, as ``scripts/demo.sh`` finds it), stdout and
stderr interleaved as a terminal shows them (and one intra-op thread unless ``OMP_NUM_THREADS`` says otherwise).
``--write`` rewrites every block in place; ``--check`` exits 1 naming each sample whose output differs, with a
short diff. Both sides are normalised alike before they are compared (:func:`comparable`): times, log timestamps
and pids; the paths of this machine (and the dlinfer source, as ``$VENDOR_GRAPH_DLINFER_SRC``) are replaced before
a block is written (:func:`present`). The samples are
documented for the demo's environment (``scripts/demo.sh``'s ``.venv``: torch 2.13 CPU, the newest supported
lmdeploy).

    python tools/samples.py --write [NAME ...]
    python tools/samples.py --check [NAME ...]
    python tools/samples.py --list
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STANDINS = ROOT / "sim" / "vendor_graph_sim" / "data" / "standins"
FROM_STATS = "benchmarks/results/capacity_refit_h200"
DLINFER_ENV = "VENDOR_GRAPH_DLINFER_SRC"
DLINFER_SNAPSHOT = ROOT.parent / "shared" / "third_party" / "dlinfer"  # where scripts/demo.sh and .ci/run look


@dataclass(frozen=True)
class Sample:
    name: str
    document: str  # relative to the repository root
    args: tuple[str, ...]  # after `vendor-graph`
    status: int = 0
    timeout: int = 300
    dlinfer: bool = False  # runs lmdeploy's engine over the real dlinfer (VENDOR_GRAPH_DLINFER_SRC)

    @property
    def command(self) -> str:
        return "$ vendor-graph " + " ".join(self.args)

    @property
    def path(self) -> Path:
        return ROOT / self.document


SAMPLES: tuple[Sample, ...] = (
    Sample("doctor", "README.md", ("doctor",)),
    Sample("demo", "README.md", ("demo",), dlinfer=True),
    Sample("demo-camb", "docs/verification.md", ("demo", "--vendor", "camb"), dlinfer=True),
    Sample("plan-ascend", "docs/capacity.md", ("plan", "--vendor", "ascend", "--max-batches", "256")),
    Sample("plan-from-stats", "docs/capacity.md",
           ("plan", "--from-stats", f"{FROM_STATS}/stats_fit1.json", f"{FROM_STATS}/stats_fit2.json",
            "--max-graphs", "7")),
)
BY_NAME = {s.name: s for s in SAMPLES}

BLOCK = re.compile(r"^<!-- sample: (?P<name>[\w.-]+) -->\n```[^\n]*\n(?P<body>.*?)^```\n<!-- /sample -->$",
                   re.M | re.S)
MARKER = re.compile(r"^<!-- sample: ([\w.-]+) -->$", re.M)

TIMES = (
    (re.compile(r"\b\d+\.\d+ (ms|s)\b"), r"<t> \1"),
    # the "capture s" column of vendor_graph.runtime.counters' table: after the waste percentage
    (re.compile(r"^(\s*\d+\s+\d+\s+\d+\s+\d+\s+\d+\s+\d+\.\d%\s+)\d+\.\d+(?= )", re.M), r"\1<t>"),
    (re.compile(r"\b\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\b"), "<timestamp>"),
    (re.compile(r"\b(pid)([ =:]+)\d+\b"), r"\1\2<pid>"),
)
SITE_PACKAGES = re.compile(r"(?:[A-Za-z]:)?[^\s'\"()=,]*[/\\](?:site|dist)-packages")


def dlinfer_source() -> str | None:
    """The dlinfer source checkout the engine's samples run on: ``VENDOR_GRAPH_DLINFER_SRC`` as set, else the
    snapshot beside the clone where it exists, else None."""
    given = os.environ.get(DLINFER_ENV)
    if given:
        return os.path.abspath(given)
    return str(DLINFER_SNAPSHOT.resolve()) if (DLINFER_SNAPSHOT / "dlinfer" / "__init__.py").is_file() else None


def _path_rules() -> list[tuple[re.Pattern[str], str]]:
    rules = [(SITE_PACKAGES, "<site-packages>")]
    source = dlinfer_source()
    for root in dict.fromkeys((source, os.path.realpath(source)) if source else ()):
        rules.append((re.compile(re.escape(root) + r"(?![\w.-])"), f"${DLINFER_ENV}"))
    for root in dict.fromkeys((str(ROOT), os.path.realpath(ROOT))):
        rules.append((re.compile(re.escape(root) + r"(?![\w.-])"), "<repo>"))
    for tmp in dict.fromkeys((tempfile.gettempdir(), os.path.realpath(tempfile.gettempdir()))):
        rules.append((re.compile(re.escape(tmp) + r"/[^/\s'\"]+"), "<tmp>"))
    home = str(Path.home())
    if home not in ("", "/"):
        rules.append((re.compile(re.escape(home) + r"(?![\w.-])"), "~"))
    return rules


def present(text: str) -> str:
    """``text`` as a document shows it: this machine's paths replaced, no trailing blanks."""
    for pattern, token in _path_rules():
        text = pattern.sub(token, text)
    return "\n".join(line.rstrip() for line in text.splitlines()).strip("\n") + "\n"


def comparable(text: str) -> str:
    """``text`` with what differs from run to run (times, timestamps, pids) replaced."""
    text = present(text)
    for pattern, token in TIMES:
        text = pattern.sub(token, text)
    return text


def child_env(sample: Sample | None = None) -> dict[str, str]:
    """This environment without VENDOR_GRAPH_* settings (but the dlinfer source for ``sample``'s engine) and
    without the test suite's stand-in dlinfer, stdout unbuffered (so it interleaves with stderr as on a
    terminal)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VENDOR_GRAPH_")}
    source = dlinfer_source() if sample is not None and sample.dlinfer else None
    if source is not None:
        env[DLINFER_ENV] = source
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
             if p and Path(p).resolve() != STANDINS.resolve()]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    else:
        env.pop("PYTHONPATH", None)
    env["PYTHONUNBUFFERED"] = "1"
    # Tiny tensors: more intra-op threads only add overhead, and slow a demo on a busy machine several times over.
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@dataclass(frozen=True)
class Run:
    status: int
    output: str


def run(sample: Sample, extra: tuple[str, ...] = ()) -> Run:
    """What ``sample``'s command prints; ``extra`` arguments must not change that (``--json PATH``)."""
    proc = subprocess.run([sys.executable, "-m", "vendor_graph", *sample.args, *extra], cwd=ROOT,
                          env=child_env(sample), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=sample.timeout)
    return Run(proc.returncode, proc.stdout)


def stored(sample: Sample) -> tuple[str, str] | None:
    """The command line and the output the sample's document holds, or None without its block."""
    for match in BLOCK.finditer(sample.path.read_text()):
        if match.group("name") == sample.name:
            command, _, output = match.group("body").partition("\n")
            return command, output
    return None


def unregistered() -> list[str]:
    """Sample markers in the documents that the registry does not know, or that sit in another document."""
    problems = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for name in MARKER.findall(path.read_text()):
            where = path.relative_to(ROOT).as_posix()
            if name not in BY_NAME:
                problems.append(f"{where}: sample {name!r} is not in tools/samples.py's SAMPLES")
            elif BY_NAME[name].document != where:
                problems.append(f"{where}: sample {name!r} belongs to {BY_NAME[name].document}")
    return problems


def check(sample: Sample, fresh: Run | None = None) -> str | None:
    """Why ``sample``'s block does not hold what its command prints now, or None."""
    held = stored(sample)
    if held is None:
        return f"{sample.document} has no block <!-- sample: {sample.name} --> ... <!-- /sample -->"
    command, output = held
    if command != sample.command:
        return f"{sample.document}: the block shows {command!r}, the registry runs {sample.command!r}"
    fresh = run(sample) if fresh is None else fresh
    if fresh.status != sample.status:
        return (f"`{sample.command[2:]}` exited {fresh.status}, the sample expects {sample.status}:\n"
                + present(fresh.output)[-3000:])
    want, got = comparable(output), comparable(fresh.output)
    if want == got:
        return None
    diff = difflib.unified_diff(want.splitlines(), got.splitlines(), f"{sample.document} ({sample.name})",
                                "now", lineterm="", n=1)
    return "\n".join(list(diff)[:40])


def write(sample: Sample, fresh: Run | None = None) -> bool:
    """Rewrite ``sample``'s block with what its command prints now; whether the document changed."""
    fresh = run(sample) if fresh is None else fresh
    if fresh.status != sample.status:
        raise SystemExit(f"{sample.name}: `{sample.command[2:]}` exited {fresh.status}, not {sample.status}; "
                         f"block left as it was:\n{present(fresh.output)[-3000:]}")
    text = sample.path.read_text()
    block = (f"<!-- sample: {sample.name} -->\n```console\n{sample.command}\n{present(fresh.output)}```\n"
             f"<!-- /sample -->")
    found = [m for m in BLOCK.finditer(text) if m.group("name") == sample.name]
    if not found:
        marker = re.search(rf"^<!-- sample: {re.escape(sample.name)} -->$", text, re.M)
        raise SystemExit(f"{sample.document}: no well-formed block for sample {sample.name!r}"
                         + ("" if marker else " (add its markers first)"))
    new = text[:found[0].start()] + block + text[found[0].end():]
    if new != text:
        sample.path.write_text(new)
    return new != text


def documented_environment() -> str | None:
    """Why this environment is not the one the samples are documented for, or None."""
    from packaging.version import Version

    from vendor_graph.upstream import compat

    newest = max((s for series in compat.SUPPORTED_SERIES.values() for s in series), key=Version)
    here = compat.installed_lmdeploy_version()
    if here is None or compat.series(here) != newest:
        return f"the samples show lmdeploy {newest}; this environment has {here or 'no lmdeploy'}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="regenerate the blocks in place")
    mode.add_argument("--check", action="store_true", help="exit 1 if a block differs from its command's output")
    mode.add_argument("--list", action="store_true", help="print the registry")
    parser.add_argument("--force", action="store_true", help="--write in an environment the samples are not for")
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"default: all of {', '.join(BY_NAME)}")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BY_NAME]
    if unknown:
        parser.error(f"no sample {', '.join(unknown)}; the samples are {', '.join(BY_NAME)}")
    chosen = [BY_NAME[n] for n in args.names] or list(SAMPLES)
    if args.list:
        for s in chosen:
            print(f"{s.name:<16} {s.document:<22} {s.command}")
        return 0
    problems = unregistered()
    if args.write:
        sys.path.insert(0, str(ROOT))
        why = documented_environment()
        if why and not args.force:
            raise SystemExit(f"not writing: {why} (run it with scripts/demo.sh's .venv, or give --force)")
        for s in chosen:
            print(f"{s.name}: {s.document} " + ("updated" if write(s) else "unchanged"))
    else:
        for s in chosen:
            problem = check(s)
            if problem:
                problems.append(f"{s.name}: {problem}")
            print(f"{s.name}: {'differs' if problem else 'ok'}")
    if problems:
        print("\n" + "\n\n".join(problems) + "\n\nregenerate with: python tools/samples.py --write", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
