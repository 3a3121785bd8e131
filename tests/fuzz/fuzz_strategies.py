"""What the fuzz suite generates: command-line words, setting values and file contents, good and hostile."""

from __future__ import annotations

import json

from hypothesis import event
from hypothesis import strategies as st

from vendor_graph import VENDORS
from vendor_graph.sizing.planning import STATS_FORMAT, STATS_VENDORS

# -- words -------------------------------------------------------------------------------------------------

INTS = st.one_of(
    st.integers(min_value=-3, max_value=300),
    st.sampled_from([0, 1, 16, 256, 257, 1024, 65536, 65537, 2**31, 2**63, 10**18, 10**30]),
    st.integers(),
)
NUMBER_TEXT = st.one_of(
    INTS.map(str),
    st.sampled_from(["", " ", "1.5", "0.5", "1e3", "nan", "inf", "-inf", "0x10", "1_000", "٣", "+4", "-0",
                     "9" * 5000, "1" * 50, "  7  ", "7\n", "½"]),
)
JUNK = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["--", "-", "---", "-h", "--help", "--version", "--vendor", "--json", "=", "--x=1", "''",
                     "\\", "☃", "é", "-1", "ascend", "plan", "doctor", "run", "demo", "paths", "G5"]),
)
VENDOR_WORDS = st.one_of(st.sampled_from([*VENDORS, "cuda", "ASCEND", "npu", ""]), st.text(max_size=6))
LOG_LEVELS = st.sampled_from(["DEBUG", "info", "Warning", "error", "CRITICAL", "loud", ""])


def flag(name: str, values: st.SearchStrategy | None = None, count: int = 1) -> st.SearchStrategy:
    """``[name, value ...]``: an option with ``count`` values (any number for -1), or a bare flag."""
    if values is None:
        return st.just([name])
    if count == -1:
        return st.lists(values, max_size=5).map(lambda vs: [name, *vs])
    return st.lists(values, min_size=count, max_size=count).map(lambda vs: [name, *vs])


def argv_of(options: list[st.SearchStrategy], extra: st.SearchStrategy = JUNK) -> st.SearchStrategy:
    """A list of some of ``options`` (each a list of words) in any order, some repeated, a little junk between."""
    junk = st.lists(extra, min_size=1, max_size=2)
    weighted = st.one_of(*options, *options, junk) if options else junk
    return st.lists(weighted, max_size=5).map(lambda parts: [w for part in parts for w in part])


# -- settings ----------------------------------------------------------------------------------------------

SIZE_TEXT = st.one_of(
    st.lists(INTS, min_size=0, max_size=6).map(lambda v: ",".join(map(str, v))),
    st.lists(st.integers(1, 300), min_size=1, max_size=6).map(lambda v: " ".join(map(str, v))),
    st.lists(st.integers(1, 300), min_size=1, max_size=6).map(json.dumps),
    st.sampled_from(["[", "]", "[[1]]", ",,,", "1,,2", "[1, 2", "0", "-1", "1.5", "one"]),
)
BYTES_TEXT = st.one_of(
    st.tuples(NUMBER_TEXT, st.sampled_from(["", "B", "iB", "KiB", "MiB", "GiB", "TiB", "K", "M", "G", "T", "MB",
                                            "kb", " GiB", "PiB", "X"])).map("".join),
    st.sampled_from(["auto", "off", "AUTO", "none"]),
)
FLAG_TEXT = st.sampled_from(["1", "0", "true", "FALSE", "yes", "no", "on", "off", "2", "", "maybe", "  on "])
WORD_TEXT = st.one_of(st.sampled_from(["auto", "off", "eager", "log", "graph-update", "task-update", "G5", "G0",
                                       "2.9.0.post9", "2.10.0rc2", "ascend", "camb", "maca", "cuda", "all",
                                       "prefill-attention", "state-cache", "prefill-attention,state-cache"]),
                      st.text(max_size=10))


def setting_values(name: str) -> st.SearchStrategy:
    """Values for the variable ``name``: ones of its kind, near misses and junk."""
    from vendor_graph.config import settings

    kind = getattr(settings.declaration(name), "kind", None)
    own = {
        "Flag": FLAG_TEXT, "Whole": NUMBER_TEXT, "Number": NUMBER_TEXT, "SizeList": SIZE_TEXT,
        "Bytes": BYTES_TEXT,
    }.get(type(kind).__name__, WORD_TEXT)
    return st.one_of(own, own, NUMBER_TEXT, WORD_TEXT).filter(lambda v: "\0" not in v)


def environments(paths: list[str] | None = None) -> st.SearchStrategy:
    """A few ``VENDOR_GRAPH_*`` variables (declared ones, misspelt ones) with generated values; ``paths``: file
    names a path-valued setting may take."""
    from vendor_graph.config import settings

    names = sorted(settings.SETTINGS)
    # built from the prefix: the registry test reads every VENDOR_GRAPH_ name written out in the repository
    misspelt = [settings.PREFIX + name for name in ("SHADOWS", "STATS", "CAPTURE_SIZE", "", "vendor",
                                                    "PLAN_MAX_GRAPH")]
    path_values = st.sampled_from(paths) if paths else st.nothing()

    def value(name: str) -> st.SearchStrategy:
        if name in ("VENDOR_GRAPH_STATS_FILE", "VENDOR_GRAPH_CAPTURE_SIZES", "VENDOR_GRAPH_DLINFER_SRC") and paths:
            return st.one_of(path_values, setting_values(name))
        return setting_values(name)

    pair = st.sampled_from(names + misspelt).flatmap(lambda n: st.tuples(st.just(n), value(n)))
    return st.lists(pair, max_size=4).map(dict)


# -- file contents -----------------------------------------------------------------------------------------


@st.composite
def stats_documents(draw, vendor: str | None = None, max_batches: int | None = None) -> dict:
    """A stats document as vendor_graph's writer would write it."""
    max_batches = max_batches or draw(st.integers(1, 300))
    sizes = sorted(set(draw(st.lists(st.integers(1, max_batches), max_size=8))) | {max_batches})
    batches = draw(st.dictionaries(st.integers(1, max_batches), st.integers(0, 10**6), max_size=12))
    doc = {"format": STATS_FORMAT, "vendor": vendor or draw(st.sampled_from(STATS_VENDORS)),
           "max_batches": max_batches, "capture_sizes": sizes,
           "batch_histogram": {str(b): n for b, n in sorted(batches.items())}}
    if draw(st.booleans()):
        doc["query_len_histogram"] = {"1": doc["batch_histogram"]}
    if draw(st.booleans()):
        doc["num_layers"] = draw(st.integers(0, 200))
    if draw(st.booleans()):
        doc["graph_memory_bytes"] = draw(st.integers(0, 2**40))
    return doc


JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12,
)


def _nested(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


@st.composite
def hostile(draw, good: dict) -> bytes:
    """``good`` as bytes, made hostile one way: truncated, nested, huge, wrong-typed, non-UTF-8, or other JSON."""
    text = json.dumps(good)
    how = draw(st.sampled_from(["valid", "truncated", "nested", "nested_field", "huge_histogram", "huge_numbers",
                                "wrong_type", "non_utf8", "latin1", "empty", "bom", "nan", "long_digits",
                                "other_json", "padding", "binary"]))
    event(f"file: {how}")  # pytest --hypothesis-show-statistics: which kinds of file were tried
    if how == "valid":
        return text.encode()
    if how == "truncated":
        return text[:draw(st.integers(0, max(0, len(text) - 1)))].encode()
    if how == "nested":
        return _nested(draw(st.sampled_from([50, 1000, 5000, 100_000]))).encode()
    if how == "nested_field":
        key = draw(st.sampled_from(sorted(good)))
        depth = draw(st.sampled_from([100, 3000, 50_000]))
        return text.replace(json.dumps(key) + ": ", json.dumps(key) + ": " + "[" * depth, 1).encode() + b"]" * depth
    if how == "huge_histogram":
        count = draw(st.sampled_from([2000, 30_000, 70_000]))
        doc = dict(good, max_batches=count + 1, capture_sizes=[count + 1],
                   batch_histogram={str(b): 1 + b % 7 for b in range(1, count + 1)})
        doc.pop("query_len_histogram", None)
        return json.dumps(doc).encode()
    if how == "huge_numbers":
        key = draw(st.sampled_from(["max_batches", "num_layers", "graph_memory_bytes", "capture_sizes",
                                    "batch_histogram"]))
        big = draw(st.sampled_from([10**18, 2**63, 10**300, -1, 0]))
        value = {"capture_sizes": [1, big], "batch_histogram": {"1": big, str(big): 1}}.get(key, big)
        return json.dumps(dict(good, **{key: value})).encode()
    if how == "wrong_type":
        key = draw(st.sampled_from(sorted(good) + ["query_len_histogram"]))
        return json.dumps(dict(good, **{key: draw(JSON_VALUES)})).encode()
    if how == "non_utf8":
        at = draw(st.integers(0, len(text)))
        return text[:at].encode() + draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80\x80"])) \
            + text[at:].encode()
    if how == "latin1":
        return json.dumps(dict(good, note="café ☃"), ensure_ascii=False).encode("utf-16")
    if how == "empty":
        return b""
    if how == "bom":
        return b"\xef\xbb\xbf" + text.encode()
    if how == "nan":
        return text.replace("1", "NaN", 1).replace("2", "Infinity", 1).encode()
    if how == "long_digits":
        number = str(good.get("max_batches") or good["capture_sizes"][0])
        return text.replace(number, "9" * 5000, 1).encode()
    if how == "other_json":
        return json.dumps(draw(JSON_VALUES)).encode()
    if how == "padding":
        return text.encode() + b" " * draw(st.sampled_from([10, 3 * 2**20]))
    return draw(st.binary(max_size=64))


@st.composite
def stats_files(draw) -> bytes:
    return draw(hostile(draw(stats_documents())))


@st.composite
def capture_size_files(draw) -> bytes:
    sizes = draw(st.lists(st.integers(1, 300), min_size=1, max_size=8))
    form = draw(st.sampled_from(["plan", "list", "text"]))
    if form == "text":
        good = {"capture_sizes": sizes}  # hostile() mutates a document; the plain-text form is tried below
        if draw(st.booleans()):
            return draw(st.sampled_from([",", " ", "\n"])).join(map(str, sizes)).encode()
    elif form == "list":
        if draw(st.booleans()):
            return json.dumps(sizes).encode()
        good = {"capture_sizes": sizes}
    else:
        good = {"capture_sizes": sizes, "padded_fraction_before": 0.5, "padded_fraction_after": 0.1,
                "max_graphs": len(sizes), "vendor": "ascend", "max_batches": max(sizes)}
    return draw(hostile(good))
