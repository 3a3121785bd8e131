"""``vendor-graph run`` as an operator runs it (a child interpreter): the command's exit status and signals are
its own (exec replaces the CLI), one line on stderr says what is armed, and a command that cannot be started
exits 2 with one line naming it and the fix, never a traceback."""

from __future__ import annotations

import errno
import os
import select
import signal
import subprocess
import sys
import time

import pytest

from vendor_graph.ops import cli

TIMEOUT = 120  # seconds for one CLI run to finish
READY_TIMEOUT = 30  # seconds for the command to say it is ready for a signal
ARMED = ("vendor-graph run: ascend graph mode armed for lmdeploy in {name!r} and the processes it starts "
         "(VENDOR_GRAPH_VENDOR=ascend, read by the autoload hook vendor_graph_autoload.pth{sim})")


def _env(**changes):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VENDOR_GRAPH_")}
    env.update(changes)
    return env


def _cli(*args, env=None, timeout=TIMEOUT):
    return subprocess.run([sys.executable, "-m", "vendor_graph", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env() if env is None else env)


def _armed(name: str, sim: str | None = None) -> str:
    return ARMED.format(name=name, sim=f"; simulated NPU: VENDOR_GRAPH_SIM={sim}" if sim else "")


def _one_error_line(proc) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and proc.stderr.endswith("\n"), proc.stderr
    assert lines[0].startswith("vendor-graph run: error: "), lines[0]
    return lines[0]


def test_run_exits_with_the_command_status():
    proc = _cli("run", "--vendor", "ascend", "--", sys.executable, "-c", "import sys; sys.exit(7)")
    assert proc.returncode == 7, proc.stderr
    assert proc.stderr.splitlines() == [_armed(sys.executable)]


@pytest.mark.parametrize("sim", [None, "G5", "2.9.0.post9"])
def test_run_says_in_one_line_what_it_armed(sim):
    env = _env() if sim is None else _env(VENDOR_GRAPH_SIM=sim)
    code = "import os; print(os.environ['VENDOR_GRAPH_VENDOR'])"
    proc = _cli("run", "--vendor", "ascend", "--", sys.executable, "-c", code, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ascend\n"
    assert proc.stderr.splitlines() == [_armed(sys.executable, sim)]


def test_run_keeps_the_disable_autoload_warning_before_the_armed_line():
    proc = _cli("run", "--vendor", "ascend", "--", "true", env=_env(VENDOR_GRAPH_DISABLE_AUTOLOAD="1"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        "vendor-graph run: ignoring VENDOR_GRAPH_DISABLE_AUTOLOAD for this command (it would keep the vendor off)",
        _armed("true")]


# The command catches the signal itself (so its status says it got it), writes a marker, and exits with a status
# of its own. SIGINT's handler is installed explicitly: a child of a shell's background job starts with SIGINT
# ignored, and Python then installs no KeyboardInterrupt handler of its own.
SIGTERM_CHILD = """
import os, signal, sys, time
def stop(signum, frame):
    open(sys.argv[1], "w").write("SIGTERM")
    sys.exit(5)
signal.signal(signal.SIGTERM, stop)
print("READY", os.getpid(), flush=True)
time.sleep(60)
sys.exit(0)
"""
SIGINT_CHILD = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
try:
    print("READY", os.getpid(), flush=True)  # inside the try: the signal may come as soon as READY is read
    time.sleep(60)
except KeyboardInterrupt:
    open(sys.argv[1], "w").write("SIGINT")
    sys.exit(6)
sys.exit(0)
"""


def _ready_pid(proc: subprocess.Popen, timeout: float) -> int:
    """The pid the command prints with READY on its first line of stdout, waiting at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    fd = proc.stdout.fileno()
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        assert left > 0, f"no READY within {timeout} s: {data!r}"
        readable, _, _ = select.select([fd], [], [], left)
        if readable:
            chunk = os.read(fd, 4096)
            assert chunk, f"stdout closed before READY (status {proc.poll()}): {data!r}"
            data += chunk
    word, pid = data.split(b"\n", 1)[0].split()
    assert word == b"READY", data
    return int(pid)


@pytest.mark.parametrize("signum,child,status", [(signal.SIGTERM, SIGTERM_CHILD, 5),
                                                  (signal.SIGINT, SIGINT_CHILD, 6)], ids=["SIGTERM", "SIGINT"])
def test_signal_to_vendor_graph_run_reaches_the_command(tmp_path, signum, child, status):
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-m", "vendor_graph", "run", "--vendor", "ascend", "--",
                             sys.executable, "-c", child, str(marker)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    pid = None
    try:
        pid = _ready_pid(proc, READY_TIMEOUT)
        assert pid == proc.pid  # exec: the command is the process that was started, not a child of it
        proc.send_signal(signum)
        assert proc.wait(timeout=READY_TIMEOUT) == status
    finally:
        for leftover in {proc.pid, pid} - {None}:
            if leftover == proc.pid and proc.poll() is not None:
                continue
            try:
                os.kill(leftover, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=READY_TIMEOUT)
        stderr = proc.stderr.read().decode()
        proc.stdout.close()
        proc.stderr.close()
    assert marker.read_text() == signal.Signals(signum).name
    assert "Traceback" not in stderr
    assert stderr.splitlines() == [_armed(sys.executable)]


def _unrunnable_cases(tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho ran\n")
    script.chmod(0o644)
    on_path = tmp_path / "bin"
    on_path.mkdir()
    (on_path / "vg-plain-file").write_text("#!/bin/sh\necho ran\n")
    (on_path / "vg-plain-file").chmod(0o644)
    path_env = _env(PATH=f"{on_path}{os.pathsep}{os.environ.get('PATH', os.defpath)}")
    return {
        "not-on-path": (["vendor-graph-no-such-command-xyz"], None, [
            "'vendor-graph-no-such-command-xyz' not found on PATH: install it in this environment",
            "or give its path"]),
        "missing-path": ([str(tmp_path / "nope")], None, [f"{str(tmp_path / 'nope')!r} does not exist: check the "
                                                          f"path"]),
        "directory": ([str(folder)], None, [f"{str(folder)!r} is a directory, not a command: give the program "
                                            f"inside it to run"]),
        "not-executable": ([str(script)], None, [f"{str(script)!r} is not executable: chmod +x {script}",
                                                 f"python {script}"]),
        "not-executable-on-path": (["vg-plain-file"], path_env, [
            f"'vg-plain-file' on PATH ({on_path / 'vg-plain-file'}) is not executable: chmod +x "
            f"{on_path / 'vg-plain-file'}"]),
        "empty-name": ([""], None, ["the command name is empty (vendor-graph run ... -- '')",
                                    "give the program to run after --, e.g. vendor-graph run --vendor ascend -- "
                                    "lmdeploy serve"]),
    }


CASE_IDS = ["not-on-path", "missing-path", "directory", "not-executable", "not-executable-on-path", "empty-name"]


@pytest.mark.parametrize("case", CASE_IDS)
def test_a_command_that_cannot_run_is_one_line_and_exit_2(tmp_path, case):
    command, env, expected = _unrunnable_cases(tmp_path)[case]
    proc = _cli("run", "--vendor", "ascend", "--", *command, env=env)
    line = _one_error_line(proc)
    for text in expected:
        assert text in line, (text, line)


def test_exec_refusing_the_command_is_one_error_line_and_exit_2(tmp_path):
    """An executable file that is no program (no #! line): only exec finds out, after the armed line."""
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x01\x02 not a program\n")
    junk.chmod(0o755)
    proc = _cli("run", "--vendor", "ascend", "--", str(junk))
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        _armed(str(junk)),
        f"vendor-graph run: error: {str(junk)!r} could not be started: Exec format error: give a program this "
        f"machine can run (a script needs a #! line and chmod +x)"]


def _clean_environ(monkeypatch):
    for name in [k for k in os.environ if k.startswith("VENDOR_GRAPH_")]:
        monkeypatch.delenv(name)


def _no_exec(*args):
    raise AssertionError(f"exec reached with {args!r}")


@pytest.mark.parametrize("command,what", [(["a\0b"], "the command name ('a\\x00b')"),
                                          (["true", "x\0"], "argument 1 of 'true' ('x\\x00')")],
                         ids=["name", "argument"])
def test_a_nul_byte_is_refused_before_exec(capsys, monkeypatch, command, what):
    """A NUL cannot come through a real command line, only through main(argv): in-process, exec stubbed."""
    monkeypatch.setattr(os, "execvpe", _no_exec)
    _clean_environ(monkeypatch)
    assert cli.main(["run", "--vendor", "ascend", "--", *command]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert err == f"vendor-graph run: error: {what} holds a NUL byte, which no program can be given: remove it\n"


@pytest.mark.parametrize("exc,reason", [(ValueError("embedded null byte"), "embedded null byte"),
                                        (OSError(errno.E2BIG, "Argument list too long"), "Argument list too long"),
                                        (PermissionError(errno.EACCES, "Permission denied"), "Permission denied")],
                         ids=["ValueError", "OSError", "PermissionError"])
def test_exec_errors_the_checks_miss_are_caught(capsys, monkeypatch, exc, reason):
    def refuse(*args):
        raise exc

    monkeypatch.setattr(os, "execvpe", refuse)
    _clean_environ(monkeypatch)
    assert cli.main(["run", "--vendor", "ascend", "--", "true"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert err.splitlines() == [_armed("true"), f"vendor-graph run: error: 'true' could not be started: {reason}: "
                                                f"give a program this machine can run (a script needs a #! line "
                                                f"and chmod +x)"]
