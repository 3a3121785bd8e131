"""The fuzz suite's runner: ``vendor-graph`` in this process, with its own argv, environment and working folder.

:func:`invoke` calls :func:`vendor_graph.ops.cli.main` as the console script does and gives back the exit status,
stdout, stderr (warnings and log records included) and the seconds it took, or the traceback of an exception
that escaped it (a bug: the CLI prints user errors as one line). Two things a test process cannot let happen
are stood in for: ``os.execvpe`` (``run`` would replace pytest with the command; the stand-in records the
command, and the run counts as started: status 0) and the demo's runs themselves (the engine, the server and the
tiny decoder take seconds each and the simulator renames torch's device backend for the whole process: the
stand-ins run the demo's own checks and its ``--json`` writer; tests/fuzz/test_subprocess.py runs the real demo).
A run past :data:`HARD_BOUND` seconds is stopped by SIGALRM and reported as such.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, settings

EXAMPLES_ENV = "VENDOR_GRAPH_FUZZ_EXAMPLES"
# Examples per fuzz test: the default keeps the whole suite near a minute on one core (scripts/test.sh runs it
# once per test command); VENDOR_GRAPH_FUZZ_EXAMPLES=2000 (say) searches harder, on demand.
EXAMPLES = int(os.environ.get(EXAMPLES_ENV) or 80)
# Seconds one in-process command may take: far above what any takes (the first doctor imports for ~3 s; the rest
# take milliseconds), so a loaded 2-core machine does not trip it, far below the minutes the unbounded
# plans ran.
BOUND = 20.0
HARD_BOUND = 60.0  # seconds after which it is stopped (SIGALRM) and reported
STATUSES = {0, 1, 2}  # ok, a check found a problem (doctor, plan's self-check), a user error
SIGNAL_STATUSES = {130, 141}  # interrupted, broken pipe: where a signal or a closed pipe applies (own process)

# derandomize: every run draws the same examples (a failure reproduces); no database: nothing written to the clone
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None, print_blob=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large, HealthCheck.filter_too_much,
                                       HealthCheck.large_base_example])


def scaled(fraction: float, least: int = 1) -> settings:
    """:data:`FUZZ` with a share of the examples (for tests whose examples cost more)."""
    return settings(FUZZ, max_examples=max(least, int(EXAMPLES * fraction)))


class RanPastBound(BaseException):
    """Raised by SIGALRM in a command that ran past :data:`HARD_BOUND`."""


class _Exec(BaseException):
    def __init__(self, command: list[str]):
        super().__init__(command)
        self.command = command


@dataclass
class Result:
    argv: list[str]
    status: int | None
    out: str
    err: str
    seconds: float
    crash: str | None = None  # the traceback of an exception that escaped main(), or of a dying thread
    executed: list[str] | None = None  # run: the command execvpe was given
    files_before: dict[str, str] = field(default_factory=dict)
    files_after: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        return (f"vendor-graph {' '.join(map(repr, self.argv))}: status {self.status} in {self.seconds:.1f} s\n"
                f"--- stdout (tail)\n{self.out[-1500:]}\n--- stderr (tail)\n{self.err[-3000:]}\n"
                f"--- crash\n{self.crash or '-'}")


def snapshot(folder: Path | None) -> dict[str, str]:
    """Every file under ``folder``: its path -> a digest of its bytes."""
    if folder is None:
        return {}
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink():
            with contextlib.suppress(OSError):
                out[str(path.relative_to(folder))] = hashlib.sha1(path.read_bytes()).hexdigest()
    return out


@contextlib.contextmanager
def _environment(env: Mapping[str, str] | None) -> Iterator[None]:
    """``os.environ`` without the runtime's ``VENDOR_GRAPH_*`` settings (but the dlinfer the test command names),
    then ``env`` on top."""
    from vendor_graph.config import settings as vg_settings

    saved = dict(os.environ)
    for name in list(os.environ):
        if (name in vg_settings.SETTINGS and name != "VENDOR_GRAPH_DLINFER_SRC") or name == vg_settings.SIM_SWITCH:
            del os.environ[name]
    os.environ.update(env or {})
    vg_settings.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
        vg_settings.clear()


def _demo_stand_ins() -> list[tuple[object, str, object]]:
    """(module, name, stand-in) for the demo's runs: its checks and its --json writer, not the run itself."""
    try:
        from vendor_graph_sim import demo
    except ImportError:  # no simulator package: vendor-graph demo refuses with one line (DEMO_MISSING)
        return []

    def engine(args, model):
        demo._simulated_torch_npu(args.generation)
        demo._dlinfer_source()
        return _finish(args)

    def tiny(args):
        from vendor_graph.upstream import compat

        demo._check_lmdeploy(args.vendor, compat.installed_lmdeploy_version())
        return _finish(args)

    def serve(args, model):
        demo._simulated_torch_npu(args.generation)
        demo._dlinfer_source()
        return _finish(args)

    def _finish(args):
        if args.json is not None:
            demo.write_json(args.json, {"stand_in": True, "argv": list(args.argv or [])})
        return 0

    return [(demo, "_engine_demo", engine), (demo, "_tiny_demo", tiny), (demo, "_serve_demo", serve)]


def _on_alarm(signum, frame):
    raise RanPastBound(f"ran past {HARD_BOUND} s")


def invoke(argv: list[str], env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Result:
    """``vendor-graph argv`` in this process, with the runtime settings of ``env`` and in folder ``cwd``."""
    import vendor_graph
    from vendor_graph.ops import cli

    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setLevel(logging.WARNING)
    crash: list[str] = []
    executed: list[list[str]] = []

    def execvpe(file, args, environ):
        raise _Exec(list(args))

    def thread_died(info):
        crash.append("".join(traceback.format_exception(info.exc_type, info.exc_value, info.exc_traceback)))

    patches = [(os, "execvpe", execvpe), (threading, "excepthook", thread_died), *_demo_stand_ins()]
    before = snapshot(cwd)
    here = os.getcwd()
    status: int | None = None
    start = time.perf_counter()
    old_alarm = signal.signal(signal.SIGALRM, _on_alarm)
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for owner, name, value in patches:
            setattr(owner, name, value)
        logging.getLogger().addHandler(handler)
        with _environment(env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if cwd is not None:
                os.chdir(cwd)
            signal.setitimer(signal.ITIMER_REAL, HARD_BOUND)
            try:
                status = cli.main(list(argv))
            except SystemExit as exc:  # argparse's --help / --version
                status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except _Exec as exc:
                executed.append(exc.command)
                status = 0
            except RanPastBound as exc:
                crash.append(str(exc))
            except BaseException:  # noqa: BLE001 - what escaped main() is the finding
                crash.append(traceback.format_exc())
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, old_alarm)
        os.chdir(here)
        logging.getLogger().removeHandler(handler)
        for owner, name, value in saved:
            setattr(owner, name, value)
        vendor_graph.uninstall()
    seconds = time.perf_counter() - start
    return Result(list(argv), status, out.getvalue(), err.getvalue(), seconds, "\n".join(crash) or None,
                  executed[0] if executed else None, before, snapshot(cwd))


def check(result: Result, statuses: set[int] = STATUSES) -> Result:
    """What every command line must do: an expected status, no traceback, within the bound, one line for a user
    error, and nothing left half-written (a refused command leaves its folder as it found it)."""
    from hypothesis import event

    event(f"exit status {result.status}")  # pytest --hypothesis-show-statistics: how many examples got how far
    assert result.crash is None, result.describe()
    assert result.status in statuses, result.describe()
    assert "Traceback (most recent call last)" not in result.err, result.describe()
    assert result.seconds < BOUND, result.describe()
    if result.status == 2:
        lines = result.err.strip().splitlines()
        assert lines and lines[-1].startswith("vendor-graph") and ": error: " in lines[-1], result.describe()
        assert result.files_after == result.files_before, (
            f"a refused command changed its folder: {result.files_before} -> {result.files_after}\n"
            + result.describe())
    leftovers = [name for name in result.files_after if name not in result.files_before
                 and (name.endswith(".tmp") or "/." in f"/{name}")]
    assert not leftovers, f"temporary files left behind: {leftovers}\n" + result.describe()
    return result


def python() -> str:
    return sys.executable


GOOD_STATS = {"format": "vendor_graph.stats/1", "vendor": "ascend", "max_batches": 16,
              "capture_sizes": [1, 2, 4, 8, 16], "batch_histogram": {"1": 5, "3": 40, "7": 10, "12": 3},
              "num_layers": 2}


def workspace(root: Path) -> Path:
    """A fresh folder under ``root`` holding what generated words may name: good.json (a stats file), sizes.txt (a
    capture-size list), junk.json, dir/ (a folder), plain.txt (not executable), script.sh (executable, no #!)."""
    import json
    import tempfile

    folder = Path(tempfile.mkdtemp(dir=root))
    (folder / "good.json").write_text(json.dumps(GOOD_STATS))
    (folder / "sizes.txt").write_text("1,2,4,8,16\n")
    (folder / "junk.json").write_bytes(b"\xff{not json")
    (folder / "dir").mkdir()
    (folder / "plain.txt").write_text("hello\n")
    script = folder / "script.sh"
    script.write_text("echo hi\n")
    script.chmod(0o755)
    return folder


def bounded(call, *args, **kwargs):
    """``call(*args, **kwargs)`` stopped by SIGALRM after :data:`HARD_BOUND` s; returns (value or exception, s)."""
    old = signal.signal(signal.SIGALRM, _on_alarm)
    start = time.perf_counter()
    signal.setitimer(signal.ITIMER_REAL, HARD_BOUND)
    try:
        try:
            value = call(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the caller judges the exception
            value = exc
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return value, time.perf_counter() - start
