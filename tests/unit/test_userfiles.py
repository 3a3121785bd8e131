"""The one reader of files a user names (vendor_graph.config.userfiles): bounded size and nesting, UTF-8 checked, the
wrong kind of file named with its path and the fix, and nothing else in the package decoding a user's JSON."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from vendor_graph.config import settings, userfiles
from vendor_graph.config.userfiles import MAX_BYTES, MAX_DEPTH, UserFileError
from vendor_graph.sizing import planning

PACKAGE = Path(__file__).resolve().parents[2] / "vendor_graph"
FIX = "give a good file"
GOOD_STATS = {"format": planning.STATS_FORMAT, "vendor": "ascend", "max_batches": 8, "capture_sizes": [1, 2, 4, 8],
              "batch_histogram": {"3": 10, "5": 4}}


def _refused(path, match: str, **kwargs) -> str:
    with pytest.raises(UserFileError) as info:
        userfiles.read_json(path, fix=FIX, **kwargs)
    text = str(info.value)
    assert re.search(match, text), text
    assert "\n" not in text and text.endswith(FIX), text
    return text


def test_nothing_but_the_reader_decodes_json_in_the_package():
    """Every json.load/json.loads in vendor_graph/ is userfiles' own: a user's file goes through its checks."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "userfiles.py":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"\bjson\s*\.\s*loads?\s*\(|\bJSONDecoder\b|\bfrom\s+json\s+import\b", code):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}")
    assert not offenders, "read user files with vendor_graph.config.userfiles:\n" + "\n".join(offenders)


@pytest.mark.parametrize("text,depth", [("1", 0), ("[]", 1), ('{"a": [1, {"b": "[[[[{{"}]}', 3), ("[[]]" * 3, 2),
                                        ("[" * 40 + "]" * 40, MAX_DEPTH + 1), ("[" * 100000, MAX_DEPTH + 1),
                                        ('{"a": [1, 2}', 2), ('"\\"[[["', 0)])
def test_depth_counts_brackets_outside_strings(text, depth):
    assert min(userfiles.json_depth(text), MAX_DEPTH + 1) == depth


def test_deep_nesting_is_refused_before_the_decoder_recurses(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 200000 + "]" * 200000)
    start = time.perf_counter()
    _refused(path, rf"deep.json: nests arrays or objects more than {MAX_DEPTH} levels deep")
    assert time.perf_counter() - start < 5
    nested = tmp_path / "inside.json"  # valid JSON, a deep value under a key of an ordinary document
    nested.write_text(json.dumps(GOOD_STATS)[:-1] + ', "x": ' + "[" * 5000 + "]" * 5000 + "}")
    _refused(nested, "nests arrays or objects more than")
    fine = tmp_path / "fine.json"
    fine.write_text("[" * MAX_DEPTH + "]" * MAX_DEPTH)
    assert userfiles.read_json(fine, fix=FIX) is not None


def test_size_is_bounded_with_the_bound_in_the_message(tmp_path):
    path = tmp_path / "big.json"
    path.write_text("[" + "1," * (MAX_BYTES // 2) + "1]")
    _refused(path, r"big.json: is 8(\.\d+)? MiB, above the 8 MiB vendor_graph reads from a JSON file")
    small = tmp_path / "small.json"
    small.write_text("[1, 2, 3]")
    _refused(small, "above the 0.0000 MiB|above the 4.76837e-06 MiB", limit=5)


def test_bytes_must_be_utf8_and_a_bom_is_allowed(tmp_path):
    path = tmp_path / "latin.json"
    path.write_bytes(b'{"a": "caf\xe9"}')
    _refused(path, r"latin.json: is not UTF-8 text \(byte 10 is b'\\xe9'\)")
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf[1, 2]")
    assert userfiles.read_json(bom, fix=FIX) == [1, 2]


@pytest.mark.parametrize("body,match", [("", "is empty, not JSON"), ("  \n", "is empty, not JSON"),
                                        ("[NaN]", r"is not JSON \(NaN is not a JSON number"),
                                        ('{"a": Infinity}', "Infinity is not a JSON number"),
                                        ("{half", r"is not JSON \(Expecting property name"),
                                        ("[" + "9" * 5000 + "]", "is not JSON")])
def test_what_is_not_json_is_named(tmp_path, body, match):
    path = tmp_path / "f.json"
    path.write_text(body)
    _refused(path, match)


def test_a_directory_a_device_and_a_missing_file_are_named(tmp_path):
    _refused(tmp_path, "is a directory, not a JSON file")
    _refused(tmp_path / "none.json", "none.json: no such file")
    if os.path.exists("/dev/zero"):
        _refused("/dev/zero", "is not a regular file")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_pipe_nobody_writes_to_reads_as_empty_and_does_not_block(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    start = time.perf_counter()
    _refused(fifo, "is empty")
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("path,match", [(1, "path 1 is a int, not a path"), (True, "is a bool, not a path"),
                                        (b"x.json", "is a bytes, not a path"), (None, "is a NoneType, not a path"),
                                        ("", "path is empty"), ("a\0b", "holds a NUL byte")])
def test_what_is_not_a_path_is_refused_and_nothing_is_opened(path, match, capsys):
    with pytest.raises(UserFileError, match=match):
        userfiles.read_json(path, fix=FIX, what="path")
    print("stdout still open")  # open(1) would have closed file descriptor 1
    assert "stdout still open" in capsys.readouterr().out


def test_load_workload_never_takes_an_int_for_a_file_descriptor(capfd):
    with pytest.raises(planning.PlanError, match="must be a path|not a path"):
        planning.load_workload([1])
    os.write(1, b"fd 1 open\n")
    assert "fd 1 open" in capfd.readouterr().out


def test_expect_names_the_json_type_found():
    with pytest.raises(UserFileError, match=r"^f.json: sizes is an object, not an array; fix$"):
        userfiles.expect({}, list, where="f.json", name="sizes", fix="fix")
    with pytest.raises(UserFileError, match="is true/false, not a whole number"):
        userfiles.expect(True, int, where="f.json", name="n", fix="fix")
    assert userfiles.expect(3, int, where="f.json", name="n", fix="fix") == 3


def test_the_stats_reader_uses_it(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(GOOD_STATS)[:-1] + ', "x": ' + "[" * 3000 + "]" * 3000 + "}")
    with pytest.raises(planning.PlanError, match=r"s.json: nests arrays or objects more than 32 levels deep.*"
                                                 r"VENDOR_GRAPH_STATS_FILE=PATH"):
        planning.read_stats(path)
    path.write_bytes(json.dumps(GOOD_STATS).encode().replace(b'"ascend"', b'"asc\xffend"'))
    with pytest.raises(planning.PlanError, match="is not UTF-8 text"):
        planning.read_stats(path)


def test_the_capture_size_setting_uses_it(tmp_path):
    path = tmp_path / "sizes.json"
    path.write_text("[" * 3000 + "]" * 3000)
    with pytest.raises(settings.SettingsError, match=r"VENDOR_GRAPH_CAPTURE_SIZES=.*sizes.json: nests arrays or "
                                                     r"objects more than 32 levels deep"):
        settings.parse({"VENDOR_GRAPH_CAPTURE_SIZES": str(path)})
    path.write_text('{"max_graphs": 4}')
    with pytest.raises(settings.SettingsError, match="holds a JSON object without capture_sizes"):
        settings.parse({"VENDOR_GRAPH_CAPTURE_SIZES": str(path)})
    path.write_text('{"capture_sizes": [1, "2"]}')
    with pytest.raises(settings.SettingsError, match=r"capture_sizes is \[1, '2'\], not a non-empty list"):
        settings.parse({"VENDOR_GRAPH_CAPTURE_SIZES": str(path)})
    with pytest.raises(settings.SettingsError, match="is a directory, not a capture-size file"):
        settings.parse({"VENDOR_GRAPH_CAPTURE_SIZES": str(tmp_path)})
    path.write_text('{"capture_sizes": [8, 2, 4]}')
    assert settings.parse({"VENDOR_GRAPH_CAPTURE_SIZES": str(path)}).capture_sizes == (8, 2, 4)
    path.write_text("1 2\n4")
    assert settings.parse({"VENDOR_GRAPH_CAPTURE_SIZES": str(path)}).capture_sizes == (1, 2, 4)
    path.write_text("[1, 2, 4")  # not JSON, but the sizes read as text, as before
    assert settings.parse({"VENDOR_GRAPH_CAPTURE_SIZES": str(path)}).capture_sizes == (1, 2, 4)


def test_the_doctor_reads_a_hostile_stats_file_through_it(tmp_path, monkeypatch):
    from vendor_graph.ops import doctor

    path = tmp_path / "s.json"
    path.write_text("[" * 100000 + "]" * 100000)
    monkeypatch.setenv("VENDOR_GRAPH_STATS_FILE", str(path))
    problems = [text for text, problem in doctor.capacity_lines() if problem]
    assert any("nests arrays or objects more than 32 levels deep" in t for t in problems), problems
