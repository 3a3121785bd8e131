"""Cases the fuzz suite (tests/fuzz) found, kept as ordinary tests: each printed a traceback or was accepted where it
should have been refused by name."""

from __future__ import annotations

import pytest

from vendor_graph.config import settings
from vendor_graph.ops import cli


def _one_line_error(capsys, argv: list[str]) -> str:
    status = cli.main(argv)
    out, err = capsys.readouterr()
    assert status == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("vendor-graph"), err
    assert "Traceback" not in err
    return err


def test_a_json_path_whose_name_is_too_long(capsys, tmp_path, monkeypatch):
    """demo --json NAME with a 300-character NAME: json_path_type's is_dir() raised OSError (ENAMETOOLONG)."""
    pytest.importorskip("vendor_graph_sim", reason="the demo's --json option comes with the simulator package")
    monkeypatch.chdir(tmp_path)
    err = _one_line_error(capsys, ["demo", "--json", "x" * 300 + ".json"])
    assert "cannot be a file path here (File name too long); give a shorter path" in err
    err = _one_line_error(capsys, ["demo", "--json", "out\0.json"])
    assert "holds a NUL byte" in err
    assert list(tmp_path.iterdir()) == []


NESTED = b"[" * 100_000 + b"]" * 100_000


def test_a_deeply_nested_stats_file_is_refused_by_name(capsys, tmp_path):
    """plan --from-stats of a file of nested arrays: RecursionError from the JSON decoder."""
    path = tmp_path / "stats.json"
    path.write_bytes(NESTED)
    err = _one_line_error(capsys, ["plan", "--from-stats", str(path)])
    assert str(path) in err


def test_a_deeply_nested_capture_size_file_is_refused_by_name(tmp_path):
    path = tmp_path / "sizes.json"
    path.write_bytes(NESTED)
    with pytest.raises(settings.SettingsError) as info:
        settings.parse({"VENDOR_GRAPH_CAPTURE_SIZES": str(path)})
    assert "VENDOR_GRAPH_CAPTURE_SIZES" in str(info.value)


def test_a_count_setting_beyond_any_use_is_refused():
    """VENDOR_GRAPH_SHADOW of 50 digits was accepted (every 10**49th replay shadowed: never)."""
    with pytest.raises(settings.SettingsError) as info:
        settings.parse({"VENDOR_GRAPH_SHADOW": "1" * 50})
    assert "VENDOR_GRAPH_SHADOW" in str(info.value)
