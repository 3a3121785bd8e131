import importlib
import os

VENDOR = os.environ.get("DLINFER_STUB_VENDOR", "ascend")
importlib.import_module(f"{__name__}.{VENDOR}_cudagraph")
