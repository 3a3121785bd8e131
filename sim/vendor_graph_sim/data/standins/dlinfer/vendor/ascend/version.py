def ensure_ascend_runtime() -> None:
    """lmdeploy >= 0.17's Ascend init() calls this; the stand-in has no runtime to check."""
