"""lmdeploy's spawned workers (the ``mp`` executor, every multi-rank engine): a worker that dies stops the engine
at once, with the worker's error, instead of leaving it waiting for a reply that never comes (lmdeploy waits
with no timeout, and its own ``SIGUSR1`` way out deadlocks: docs/upstream.md).

In the parent, a watcher thread follows each worker's process sentinel from the moment the executor has spawned
them until it is stopped or released; a worker that exits before that is logged with the first line of its
error, the other workers are terminated and the process exits with status 1. In the worker, which inherits the
reports folder (:data:`REPORTS_ENV`) and runs vendor_graph's autoload, an exception that escapes the entry point
is recorded in that folder, where the parent reads it.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Any

from ..config import settings
from . import patching

logger = logging.getLogger("vendor_graph")

EXECUTOR_MODULE = "lmdeploy.pytorch.engine.executor.mp_executor"
REPORTS_ENV = settings.WORKER_REPORTS  # set only for the spawn: where a worker writes why it died
POLL_SECONDS = 0.5  # how soon the watcher notices that the executor was closed


# -- in the worker -----------------------------------------------------------------------------------------


def report_path(folder: str | os.PathLike, pid: int) -> Path:
    return Path(folder) / f"worker-{pid}.txt"


def _write_report(exc: BaseException) -> None:
    """This worker's error for the parent: first line its type and message, then the traceback."""
    folder = os.environ.get(REPORTS_ENV)
    if not folder or isinstance(exc, (SystemExit, KeyboardInterrupt)):
        return
    summary = " ".join(f"{type(exc).__name__}: {exc}".split())
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        report_path(folder, os.getpid()).write_text(summary + "\n" + text, encoding="utf-8")
    except OSError:
        pass  # the parent still sees the exit; the traceback is on stderr


def _reporting(main_loop: Any) -> Any:
    """``ExecutorProc._main_loop`` that reports an exception escaping it (multiprocessing prints it and exits
    with status 1; ``sys.excepthook`` never sees it)."""

    @functools.wraps(main_loop)
    def main_loop_reporting_failure(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return main_loop(self, *args, **kwargs)
        except BaseException as exc:
            _write_report(exc)
            raise

    main_loop_reporting_failure._vendor_graph_workers = True
    return main_loop_reporting_failure


def _wrap_entry_point(module: Any) -> None:
    proc = getattr(module, "ExecutorProc", None)
    main_loop = getattr(proc, "_main_loop", None)
    if main_loop is not None and not getattr(main_loop, "_vendor_graph_workers", False):
        proc._main_loop = _reporting(main_loop)


def arm_worker() -> None:
    """In a process spawned with :data:`REPORTS_ENV` (vendor_graph's autoload calls it at interpreter start,
    before there is any activation): report an error that ends the worker before its entry point runs (while
    it unpickles what the parent sent: ``sys.excepthook``) or inside it (lmdeploy's ``ExecutorProc._main_loop``,
    wrapped when its module is imported)."""
    previous = sys.excepthook

    def excepthook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        _write_report(exc)
        previous(kind, exc, tb)

    sys.excepthook = excepthook
    patching.when_imported(EXECUTOR_MODULE, _wrap_entry_point)


# -- in the parent -----------------------------------------------------------------------------------------


FAILURE_STATUS = 1  # lmdeploy's exit status for a worker failure


class WorkerWatch:
    """Follows the workers of one ``MPExecutor`` until it is closed; a worker exit before that stops this
    process with lmdeploy's worker-failure status."""

    def __init__(self, executor: Any, reports: Path):
        self.reports = reports
        self.workers = [(getattr(p, "proc_id", i), p._proc) for i, p in enumerate(executor.procs)]
        self.closed = threading.Event()
        self.failure: str | None = None
        self.thread = threading.Thread(target=self._watch, name="vendor_graph-workers", daemon=True)

    def start(self) -> None:
        _open_watches.add(self)
        self.thread.start()

    def close(self) -> None:
        self.closed.set()
        _open_watches.discard(self)
        shutil.rmtree(self.reports, ignore_errors=True)

    def describe(self, proc_id: Any, process: Any) -> str:
        code = process.exitcode
        if code is not None and code < 0:
            try:
                status = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                status = f"was killed by signal {-code}"
        else:
            status = f"exited with status {code}"
        try:
            error = report_path(self.reports, process.pid).read_text(encoding="utf-8").splitlines()[0]
        except (OSError, IndexError):
            error = "its error, if any, is in the log above"
        return (f"vendor_graph: lmdeploy's worker {process.name} (rank {proc_id}, pid {process.pid}) {status} "
                f"while the engine was running: {error}; lmdeploy's executor would wait for it forever, so this "
                f"process stops now with lmdeploy's worker-failure status {FAILURE_STATUS}")

    def _watch(self) -> None:
        from multiprocessing import connection

        sentinels = {process.sentinel: (proc_id, process) for proc_id, process in self.workers}
        while not self.closed.is_set():
            ready = connection.wait(list(sentinels), timeout=POLL_SECONDS)
            if not ready or self.closed.is_set():
                continue
            proc_id, process = sentinels[ready[0]]
            process.join(timeout=1.0)  # reap it: its exit code
            if self.closed.is_set():
                return
            self.failure = self.describe(proc_id, process)
            logger.error("%s", self.failure)
            self._stop_process()

    def _stop_process(self) -> None:
        for _, process in self.workers:
            if process.is_alive():
                process.terminate()
        for _, process in self.workers:
            process.join(timeout=5.0)
        shutil.rmtree(self.reports, ignore_errors=True)
        for handler in logging.getLogger().handlers + logger.handlers:
            handler.flush()
        for console in (sys.stdout, sys.stderr):
            try:
                console.flush()
            except (OSError, ValueError):
                pass
        os._exit(FAILURE_STATUS)


_open_watches: set[WorkerWatch] = set()


@atexit.register
def _closing() -> None:
    # Registered after multiprocessing's own exit handler, so it runs first: the daemonic workers it then
    # terminates are an exit, not a failure.
    for watch in list(_open_watches):
        watch.closed.set()


def _watched_init(original: Any) -> Any:
    @functools.wraps(original)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        reports = Path(tempfile.mkdtemp(prefix="vendor_graph-workers-"))
        before = os.environ.get(REPORTS_ENV)
        os.environ[REPORTS_ENV] = str(reports)  # read by the workers it spawns
        try:
            original(self, *args, **kwargs)
        except BaseException:
            shutil.rmtree(reports, ignore_errors=True)
            raise
        finally:
            if before is None:
                os.environ.pop(REPORTS_ENV, None)
            else:
                os.environ[REPORTS_ENV] = before
        if not all(hasattr(p, "_proc") for p in getattr(self, "procs", ())):
            logger.debug("vendor_graph: lmdeploy's MPExecutor keeps its processes elsewhere; workers not watched")
            shutil.rmtree(reports, ignore_errors=True)
            return
        self._vendor_graph_watch = WorkerWatch(self, reports)
        self._vendor_graph_watch.start()

    return __init__


def _closing_first(original: Any, name: str) -> Any:
    @functools.wraps(original)
    def close(self, *args: Any, **kwargs: Any) -> Any:
        watch = getattr(self, "_vendor_graph_watch", None)
        if watch is not None:
            watch.closed.set()
        try:
            return original(self, *args, **kwargs)
        finally:
            if watch is not None and name == "release":
                watch.close()

    return close


def install(activation: patching.Activation) -> None:
    """Watch the workers of every ``MPExecutor`` built in this process (now, or when lmdeploy's mp executor
    module is imported)."""

    def patch(module: Any) -> None:
        executor = getattr(module, "MPExecutor", None)
        if executor is None or any(p.owner is executor for p in activation.patches):
            return
        activation.add(patching.Patch(executor, "__init__", _watched_init(executor.__init__)))
        for name in ("stop", "release"):
            if callable(getattr(executor, name, None)):
                activation.add(patching.Patch(executor, name, _closing_first(getattr(executor, name), name)))

    patching.when_imported(EXECUTOR_MODULE, patch)


__all__ = ["EXECUTOR_MODULE", "REPORTS_ENV", "WorkerWatch", "arm_worker", "install"]
