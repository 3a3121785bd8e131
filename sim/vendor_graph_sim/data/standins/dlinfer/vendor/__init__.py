"""Stand-in ``dlinfer.vendor``: which vendor's kernels ``dlinfer.ops`` reaches.

The real package has one vendor per installation (its build writes ``vendor/vendor.yaml``). Here it is
``DLINFER_STUB_VENDOR`` (default ``ascend``), or, for a block, :func:`selected` (a test process serves
several vendors one after another, each as a process of that vendor would).
"""

import contextlib
import contextvars
import os

_selected = contextvars.ContextVar("dlinfer_standin_vendor", default=None)


def vendor_name():
    return _selected.get() or os.environ.get("DLINFER_STUB_VENDOR", "ascend")


@contextlib.contextmanager
def selected(name):
    token = _selected.set(name)
    try:
        yield
    finally:
        _selected.reset(token)
