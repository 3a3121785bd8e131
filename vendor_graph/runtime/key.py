"""GraphKey: what identifies one captured graph."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GraphKey:
    """One captured graph per distinct key.

    ``padded_batch`` is the bucket (never the live batch: looking a graph up by the live batch is one
    of the classic failures). ``extra`` is the model's own key (lmdeploy >= 0.16
    ``get_cudagraph_extra_key()``), empty for most models.
    """

    padded_batch: int
    decoding: bool
    microbatch: bool = False
    query_len: int = 1
    extra: tuple = ()

    def __post_init__(self) -> None:
        if self.padded_batch < 1:
            raise ValueError(f"padded_batch must be >= 1, got {self.padded_batch}")
        if self.query_len < 1:
            raise ValueError(f"query_len must be >= 1, got {self.query_len}")
        if not isinstance(self.extra, tuple):
            raise TypeError(f"extra must be a tuple (hashable), got {type(self.extra).__name__}")

    @property
    def padded_tokens(self) -> int:
        return self.padded_batch * self.query_len

    @classmethod
    def from_lmdeploy_tuple(cls, key: tuple) -> GraphKey:
        """The key of lmdeploy's CUDA runner, ``(batch, decoding, microbatch, query_len, *extra)``."""
        batch, decoding, microbatch, query_len, *extra = key
        return cls(batch, bool(decoding), bool(microbatch), query_len, tuple(extra))

    def as_lmdeploy_tuple(self) -> tuple:
        """The positional tuple lmdeploy's CUDA runner uses as a key, for interop with its maps."""
        return (self.padded_batch, self.decoding, self.microbatch, self.query_len) + self.extra
