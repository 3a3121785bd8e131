import re
from pathlib import Path

from vendor_graph.config import settings
from vendor_graph.vendors.ascend.seqlen import seqlen_path_table

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
ASCEND = ROOT / "docs" / "ascend.md"


def test_the_seqlen_path_table_is_generated_from_the_code():
    text = ASCEND.read_text()
    match = re.search(r"<!-- BEGIN seqlen-paths[^\n]*-->\n(.*?)\n<!-- END seqlen-paths -->", text, re.S)
    assert match, "docs/ascend.md lost its generated seq-len path table"
    assert match.group(1) == seqlen_path_table(), "regenerate it with: python -m vendor_graph paths"


def _settings_rows() -> dict[str, str]:
    section = README.read_text().split("\n## Settings\n", 1)
    assert len(section) == 2, "README lost its Settings section"
    rows = re.findall(r"^\| `(VENDOR_GRAPH_[A-Z_]+)[^`]*` \| (.*) \|$", section[1].split("\n## ", 1)[0], re.M)
    return dict(rows)


def test_the_readme_settings_table_is_the_settings_registry():
    rows = _settings_rows()
    assert sorted(rows) == sorted(settings.SETTINGS), "README's Settings table must list every runtime setting"
    for name, setting in settings.SETTINGS.items():
        for value in getattr(setting.kind, "values", ()):
            assert f"`{value}`" in rows[name], f"README's {name} row does not name the accepted value {value!r}"
