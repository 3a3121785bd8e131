"""Every kernel is a function that refuses to run: there is no vendor device here."""


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def kernel(*args, **kwargs):
        raise NotImplementedError(f"dlinfer.ops.{name} is a test stand-in; no vendor kernel runs here")

    kernel.__name__ = name
    return kernel
