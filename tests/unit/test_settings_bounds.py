"""Settings refused where they are parsed when a later consumer could not use them: a stats-file period past what
the writer's timer takes, a stats-file path that is no writable file, memory sizes in ambiguous units, fractions of
a byte or absurd sizes; and an unknown VENDOR_GRAPH_* name warned about once at activation."""

from __future__ import annotations

import logging
import os
import threading

import pytest

from vendor_graph.config import settings
from vendor_graph.config.settings import SettingsError
from vendor_graph.install import patching
from vendor_graph.ops import reports

STATS_FILE, STATS_EVERY, MEMORY = "VENDOR_GRAPH_STATS_FILE", "VENDOR_GRAPH_STATS_EVERY", "VENDOR_GRAPH_GRAPH_MEMORY"


def _refused(name: str, raw: str, *parts: str) -> str:
    with pytest.raises(SettingsError) as info:
        settings.parse({name: raw})
    text = str(info.value)
    assert text.startswith(f"{name}={raw[:20]!r}"[:-1]) and "\n" not in text and "Fix: " in text, text
    for part in parts:
        assert part in text, (part, text)
    return text


def test_stats_every_is_bounded_by_what_the_writers_timer_takes():
    limit = int(threading.TIMEOUT_MAX // 60)
    assert settings.STATS_EVERY_LIMIT == limit
    _refused(STATS_EVERY, str(10**12), f"{10**12} is above {limit}: the periodic stats writer waits",
             f"write a whole number from 0 to {limit}")
    _refused(STATS_EVERY, "9" * 5000, "expected a whole number N from 0 to")
    assert settings.parse({STATS_EVERY: str(limit)}).stats_every == limit


def test_the_writer_thread_survives_the_largest_period(tmp_path, monkeypatch):
    """Settings built by hand skip the parser: the writer still waits no longer than its timer can."""
    monkeypatch.setattr(settings, "_current", settings.Settings(stats_file=str(tmp_path / "s.json"),
                                                                 stats_every=10**12))
    writer = reports._StatsWriter()
    errors = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    writer.start()
    try:
        writer.thread.join(0.5)
        assert writer.thread.is_alive() and not errors, errors
    finally:
        writer.stop.set()
        writer.thread.join(5)


def test_the_stats_file_must_be_a_writable_file_in_an_existing_directory(tmp_path):
    _refused(STATS_FILE, str(tmp_path), f"{tmp_path} is a directory; give a file in it, such as "
                                        f"{tmp_path / 'vendor_graph_stats.json'}")
    _refused(STATS_FILE, str(tmp_path / "nope" / "s.json"), f"directory {tmp_path / 'nope'} does not exist; create it")
    _refused(STATS_FILE, "/proc/self/stats.json", "is under /proc, a kernel file system")
    _refused(STATS_FILE, "/dev/null", "/dev/null is under /dev")
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "pipe")
        _refused(STATS_FILE, str(tmp_path / "pipe"), "is not a regular file")
    assert settings.parse({STATS_FILE: str(tmp_path / "s.json")}).stats_file == str(tmp_path / "s.json")
    (tmp_path / "s.json").write_text("{}")  # the previous run's file: written over
    assert settings.parse({STATS_FILE: str(tmp_path / "s.json")}).stats_file == str(tmp_path / "s.json")


@pytest.mark.skipif(os.geteuid() == 0 if hasattr(os, "geteuid") else True, reason="root writes anywhere")
def test_the_stats_file_directory_must_be_writable(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        _refused(STATS_FILE, str(folder / "s.json"), "is not writable by this user")
    finally:
        folder.chmod(0o700)


@pytest.mark.parametrize("raw,parts", [
    ("512MB", ["MB is ambiguous (512MB is 512000000 bytes in SI units, 536870912 in binary ones): write 512MiB"]),
    ("2gb", ["GB is ambiguous", "write 2GiB"]),
    ("512iB", ["'iB' is not a unit: use B, KiB, MiB, GiB or TiB"]),
    ("0.5", ["0.5 is 0.5 bytes, not a whole number of bytes"]),
    ("0.1K", ["is 102.4 bytes, not a whole number of bytes"]),
    ("2TiB", ["2TiB is 2199023255552 bytes, above 1TiB: more memory than any accelerator has"]),
    (str(2**41), ["above 1TiB"]),
    ("1" * 30, ["expected a byte count"]),
])
def test_memory_sizes_are_whole_unambiguous_and_plausible(raw, parts):
    _refused(MEMORY, raw, *parts)


@pytest.mark.parametrize("raw,value", [("512MiB", 512 * 2**20), ("512 mib", 512 * 2**20), ("1.5G", 3 * 2**29),
                                       ("0.5GiB", 2**29), ("4096", 4096), ("4096B", 4096), ("1TiB", 2**40),
                                       ("auto", "auto"), ("OFF", "off")])
def test_memory_sizes_that_mean_one_thing_are_read(raw, value):
    assert settings.parse({MEMORY: raw}).graph_memory == value


def test_the_doctor_flags_an_absurd_or_ambiguous_memory_size(monkeypatch):
    from vendor_graph.ops import doctor

    for raw in ("512MB", "64TiB"):
        monkeypatch.setenv(MEMORY, raw)
        lines = doctor.settings_lines(settings.readings())
        assert any(problem and text.startswith(f"{MEMORY}=") for text, problem in lines), lines


def test_an_unknown_setting_is_warned_once_at_activation_naming_the_closest(monkeypatch, caplog):
    monkeypatch.setattr(settings, "_warned_unknown", set())
    for name in [n for n in os.environ if n.startswith(settings.PREFIX) and n not in settings.SETTINGS]:
        monkeypatch.delenv(name)  # the test harness's own names: unknown where the simulator is not installed
    monkeypatch.setenv("VENDOR_GRAPH_SHADOWS", "1")
    monkeypatch.setenv("VENDOR_GRAPH_ZZZZZZ", "1")
    caplog.set_level(logging.WARNING, logger="vendor_graph")
    patching.activate("cuda", lambda activation: None)
    patching.uninstall()
    patching.activate("cuda", lambda activation: None)
    messages = [r.getMessage() for r in caplog.records if "is not a vendor_graph setting" in r.getMessage()]
    assert messages == [
        "vendor_graph: VENDOR_GRAPH_SHADOWS is not a vendor_graph setting and does nothing (a typo?); did you mean "
        "VENDOR_GRAPH_SHADOW?",
        f"vendor_graph: VENDOR_GRAPH_ZZZZZZ is not a vendor_graph setting and does nothing (a typo?); known: "
        f"{', '.join(sorted(settings.SETTINGS))}"], messages


def test_the_doctor_and_the_warning_name_the_same_setting(monkeypatch):
    from vendor_graph.ops import doctor

    monkeypatch.setenv("VENDOR_GRAPH_STATS_FIEL", "x")
    lines = doctor.settings_lines(settings.readings({"VENDOR_GRAPH_STATS_FIEL": "x"}))
    assert lines[0][1] and "did you mean VENDOR_GRAPH_STATS_FILE?" in lines[0][0], lines
    assert ("VENDOR_GRAPH_STATS_FIEL", "VENDOR_GRAPH_STATS_FILE") in settings.unknown()
