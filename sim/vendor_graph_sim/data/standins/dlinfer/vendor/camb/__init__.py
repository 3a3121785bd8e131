"""Stand-in ``dlinfer.vendor.camb`` (tests only): see ``camb_ops``."""
