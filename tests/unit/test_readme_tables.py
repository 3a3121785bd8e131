import re
from pathlib import Path

from vendor_graph.ascend.paths_table import seqlen_path_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_seqlen_path_table_is_generated_from_the_code():
    text = README.read_text()
    match = re.search(r"<!-- BEGIN seqlen-paths[^\n]*-->\n(.*?)\n<!-- END seqlen-paths -->", text, re.S)
    assert match, "README lost its generated seq-len path table"
    assert match.group(1) == seqlen_path_table(), "regenerate it with: python -m vendor_graph paths"
