"""The fuzz suite (issue 29): generated command lines, settings and files against every ``vendor-graph`` subcommand,
the settings parser and the stats / capture-size / plan readers. Seeds are fixed (hypothesis ``derandomize``);
``VENDOR_GRAPH_FUZZ_EXAMPLES`` sets the examples per test (fuzz_harness.EXAMPLES)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # fuzz_harness, fuzz_strategies
