"""For test modules that do not depend on the lmdeploy release: they run once per test run, in the newest
release's leg (``pytestmark = newest_release_only``), and skip with that reason in the others."""

from __future__ import annotations

import pytest
from packaging.version import Version

from vendor_graph.upstream import compat

NEWEST = max((s for series in compat.SUPPORTED_SERIES.values() for s in series), key=Version)
_HERE = compat.installed_lmdeploy_version()
newest_release_only = pytest.mark.skipif(_HERE is not None and compat.series(_HERE) != NEWEST,
                                         reason=f"release-independent: runs once per test run, with lmdeploy {NEWEST}")
