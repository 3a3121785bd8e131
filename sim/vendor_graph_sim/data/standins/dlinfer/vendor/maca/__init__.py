"""Stand-in ``dlinfer.vendor.maca`` (tests only): see ``maca_ops``."""
