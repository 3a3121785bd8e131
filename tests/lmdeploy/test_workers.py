"""vendor_graph's watch over lmdeploy's spawned workers, on plain processes: a worker that exits while the watch
is open stops the parent at once with lmdeploy's worker-failure status and one line naming the worker, its exit
and its error; a watch closed first (lmdeploy stopping and releasing its executor, the interpreter exiting) lets
the workers go quietly."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from vendor_graph.install import workers

PARENT = textwrap.dedent("""
    import multiprocessing as mp, sys, tempfile, time
    from pathlib import Path
    from types import SimpleNamespace

    from vendor_graph.install import workers

    class Entry:  # lmdeploy's ExecutorProc: the worker's entry point is a method, wrapped in every process
        def _main_loop(self):
            raise RuntimeError("the device backend did not import")

    workers._wrap_entry_point(SimpleNamespace(ExecutorProc=Entry))

    def main(how):
        ctx = mp.get_context("spawn")
        target = {"exit": (sys.exit, (3,)), "raise": (Entry()._main_loop, ()),
                  "sleep": (time.sleep, (2.0,))}[how]
        reports = Path(tempfile.mkdtemp())
        import os
        os.environ[workers.REPORTS_ENV] = str(reports)
        proc = ctx.Process(target=target[0], args=target[1], name="ExecutorProc-0", daemon=True)
        proc.start()
        watch = workers.WorkerWatch(SimpleNamespace(procs=[SimpleNamespace(proc_id=0, _proc=proc)]), reports)
        watch.start()
        if how == "sleep":
            watch.close()  # lmdeploy released its executor before the worker ended
        time.sleep(3.0 if how == "sleep" else 30.0)
        print("PARENT WENT ON", flush=True)

    if __name__ == "__main__":
        main(sys.argv[1])
""")


def _parent(tmp_path, how):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    return subprocess.run([sys.executable, str(script), how], capture_output=True, text=True, timeout=25)


@pytest.mark.parametrize("how, said", [
    ("exit", "exited with status 3 while the engine was running: its error, if any, is in the log above"),
    ("raise", "exited with status 1 while the engine was running: RuntimeError: the device backend did not import"),
])
def test_a_worker_that_exits_stops_the_parent_with_its_error(tmp_path, how, said):
    proc = _parent(tmp_path, how)
    assert proc.returncode == workers.FAILURE_STATUS and "PARENT WENT ON" not in proc.stdout, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "lmdeploy's worker ExecutorProc-0 (rank 0" in line]
    assert len(lines) == 1 and said in lines[0], proc.stderr


def test_a_closed_watch_lets_its_workers_end(tmp_path):
    proc = _parent(tmp_path, "sleep")
    assert proc.returncode == 0 and "PARENT WENT ON" in proc.stdout, proc.stderr
    assert "lmdeploy's worker" not in proc.stderr
