import importlib

import pytest

pytest.importorskip("lmdeploy", reason="tests/lmdeploy need lmdeploy (see the README's test command)")

from vendor_graph.upstream import compat  # noqa: E402

SUPPORTED_HERE = compat.vendors_supporting(compat.installed_lmdeploy_version())


@pytest.fixture
def activate():
    """Activate a vendor through its module, as a user's ``import vendor_graph.<vendor>`` does."""

    def _activate(vendor: str):
        return importlib.import_module(f"vendor_graph.{vendor}").activate()

    return _activate


@pytest.fixture(params=SUPPORTED_HERE)
def vendor(request):
    """Each vendor the installed lmdeploy release supports."""
    return request.param


def pytest_report_header(config):
    return f"lmdeploy {compat.installed_lmdeploy_version()} (vendors supported: {', '.join(SUPPORTED_HERE)})"
