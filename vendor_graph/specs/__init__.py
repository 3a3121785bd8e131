"""Buffer specs per vendor (kept apart from the vendor packages, whose import activates the vendor)."""
