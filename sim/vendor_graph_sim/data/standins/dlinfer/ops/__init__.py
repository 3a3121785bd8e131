"""Stand-in ``dlinfer.ops``: ``paged_decode_attention`` (in ``.llm``, as in dlinfer) reaches the vendor's
decode attention; every other kernel is a function that refuses to run (there is no vendor device here)."""

from .llm import *  # noqa: F401,F403


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def kernel(*args, **kwargs):
        raise NotImplementedError(f"dlinfer.ops.{name} is a test stand-in; no vendor kernel runs here")

    kernel.__name__ = name
    return kernel
