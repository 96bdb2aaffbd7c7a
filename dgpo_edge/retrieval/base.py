"""The interfaces every retrieval part implements.

`Encoder` turns text into vectors (MiniLM in torch or int8 ONNX, e5-base-v2).
`Retriever` answers batched queries with passages; the agent, training
rollouts and the HTTP server all talk to this one interface, whether the index
is in-process or behind Search-R1's `/retrieve` API.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..errors import InputError
from ..protocol import Passage


@dataclass(frozen=True)
class EncoderSpec:
    """What an index needs to know about the encoder that made its vectors.

    `name` is the embedding *space* (e.g. "all-MiniLM-L6-v2"): the torch fp32 and
    the int8 ONNX variants of MiniLM share it, so an index built with one can
    be queried with the other. `variant` records which one built the index.
    """

    name: str
    variant: str
    dim: int
    normalize: bool
    query_prefix: str = ""
    passage_prefix: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EncoderSpec:
        return cls(**{k: d[k] for k in ("name", "variant", "dim", "normalize")},
                   query_prefix=d.get("query_prefix", ""), passage_prefix=d.get("passage_prefix", ""))

    def check_compatible(self, other: EncoderSpec, where: str) -> None:
        """Refuse a query encoder whose space or dimension differs from the index's."""
        if self.name != other.name or self.dim != other.dim:
            raise InputError(f"the index was built with encoder {self.name!r} (dim {self.dim}) but the "
                             f"query encoder is {other.name!r} (dim {other.dim}); pass --encoder "
                             f"{self.name!r} or rebuild the index", where)


class Encoder(ABC):
    """Text -> float32 vectors of shape [n, spec.dim] (L2-normalised when spec.normalize)."""

    spec: EncoderSpec

    @abstractmethod
    def encode_passages(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """Embed passage `contents` (the passage prefix, if any, is added here)."""

    @abstractmethod
    def encode_queries(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """Embed queries (the query prefix, if any, is added here)."""


class Retriever(ABC):
    """Batched search: one list of up to k passages per query, best first."""

    @abstractmethod
    def search(self, queries: Sequence[str], k: int = 3) -> list[list[Passage]]:
        ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release files, sessions or connections."""

    def __enter__(self) -> Retriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
