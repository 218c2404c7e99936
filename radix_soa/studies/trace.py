"""The ``Trace``: a request trace as flat ids plus per-request metadata,
and ``TraceFormatError``, the error of every trace loader
(``radix_soa.studies.traces``)."""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np

from .._input.batch import Batch

__all__ = ["Trace", "TraceFormatError", "MOONCAKE_BLOCK_SIZE"]

MOONCAKE_BLOCK_SIZE = 512

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


class TraceFormatError(ValueError):
    """Malformed trace input; the message names the file and the line
    (1-based) or request path.

    Attributes: ``path`` (str), ``reason`` (str), ``line`` (int or None) and
    ``request`` (str such as ``"requests[3].requests[2]"``, or None).

    >>> e = TraceFormatError("a.jsonl", "bad JSON", line=3)
    >>> str(e), e.line
    ('a.jsonl: line 3: bad JSON', 3)
    >>> str(TraceFormatError("c.json", "'in' is negative", request="requests[0]"))
    "c.json: requests[0]: 'in' is negative"
    """

    def __init__(self, path, reason, line=None, request=None):
        self.path = str(path)
        self.reason = reason
        self.line = line
        self.request = request
        where = []
        if line is not None:
            where.append(f"line {line}")
        if request is not None:
            where.append(request)
        super().__init__(": ".join([self.path, *where, reason]))

    def __reduce__(self):
        return (type(self), (self.path, self.reason, self.line, self.request))


@dataclass(frozen=True, eq=False)
class Trace:
    """A request trace: ``n`` id sequences stored flat, plus per-request metadata.

    Request ``i`` is ``flat[offsets[i]:offsets[i+1]]``; one id stands for one
    block of ``block_size`` tokens. ``namespace[i]`` tells which id space the
    request's ids live in (ids from different namespaces must not be treated
    as equal). The dataclass is frozen (fields cannot be rebound) but the
    arrays are ordinary writable NumPy arrays; equality is identity.

    >>> t = Trace.from_sequences([[1, 2, 3], [1, 2, 9]], name="toy")
    >>> len(t), t.num_blocks, t[1].tolist(), t.offsets.tolist()
    (2, 6, [1, 2, 9], [0, 3, 6])
    >>> s = t.summary()
    >>> s["requests"], s["total_blocks"], s["unique_ids"]
    (2, 6, 4)
    """

    name: str
    flat: np.ndarray
    offsets: np.ndarray
    timestamps: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    namespace: np.ndarray
    block_size: int

    def __post_init__(self):
        def as_int64(field):
            a = np.asarray(getattr(self, field))
            if a.size and a.dtype.kind not in "iu":
                raise TypeError(f"Trace.{field} must hold integers, got dtype {a.dtype}")
            a = np.ascontiguousarray(a, dtype=np.int64)
            object.__setattr__(self, field, a)
            return a

        flat = as_int64("flat")
        offsets = as_int64("offsets")
        if flat.ndim != 1 or offsets.ndim != 1:
            raise ValueError("Trace.flat and Trace.offsets must be 1-D")
        if len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(flat):
            raise ValueError("Trace.offsets must start at 0 and end at len(flat)")
        if np.any(np.diff(offsets) < 0):
            raise ValueError("Trace.offsets must be non-decreasing")
        n = len(offsets) - 1
        ts = np.ascontiguousarray(self.timestamps, dtype=np.float64)
        object.__setattr__(self, "timestamps", ts)
        for field in ("input_tokens", "output_tokens", "namespace"):
            as_int64(field)
        for field in ("timestamps", "input_tokens", "output_tokens", "namespace"):
            a = getattr(self, field)
            if a.shape != (n,):
                raise ValueError(f"Trace.{field} must have shape ({n},), got {a.shape}")
        if n > 1 and np.any(np.diff(ts) < 0):
            raise ValueError("Trace.timestamps must be non-decreasing")
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, (int, np.integer)) \
                or self.block_size <= 0:
            raise ValueError(f"Trace.block_size must be a positive int, got {self.block_size!r}")
        object.__setattr__(self, "block_size", int(self.block_size))
        object.__setattr__(self, "name", str(self.name))

    @classmethod
    def from_sequences(cls, sequences, name="trace", timestamps=None, input_tokens=None,
                       output_tokens=None, namespace=None, block_size=1):
        """Build a trace from a list of id sequences (lists or 1-D arrays).

        Missing metadata defaults to: timestamps 0.0, ``input_tokens`` =
        ``len(seq) * block_size``, ``output_tokens`` 0, namespace 0.

        >>> Trace.from_sequences([[5, 6], [5]]).input_tokens.tolist()
        [2, 1]
        """
        seqs = [np.asarray(s, dtype=np.int64).ravel() for s in sequences]
        lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
        n = len(seqs)
        flat = np.concatenate(seqs) if seqs else np.zeros(0, dtype=np.int64)
        return cls(
            name=name,
            flat=flat,
            offsets=_offsets(lengths),
            timestamps=np.zeros(n) if timestamps is None else timestamps,
            input_tokens=lengths * block_size if input_tokens is None else input_tokens,
            output_tokens=np.zeros(n, dtype=np.int64) if output_tokens is None else output_tokens,
            namespace=np.zeros(n, dtype=np.int64) if namespace is None else namespace,
            block_size=block_size,
        )

    def __len__(self):
        return len(self.offsets) - 1

    def __radix_batch__(self):
        """The requests as a ``radix_soa.Batch`` (zero-copy), so a trace goes
        wherever a batch does; refused when it holds several namespaces,
        whose ids must not meet in one tree."""
        if len(np.unique(self.namespace)) > 1:
            raise ValueError(
                f"trace {self.name!r} holds several namespaces whose ids must not be mixed in "
                "one tree; replay() keeps them apart, or select one namespace first")
        return Batch(self.flat, self.offsets)

    def __getitem__(self, i):
        """The ``i``-th request's id sequence (a view into ``flat``).

        >>> Trace.from_sequences([[1], [2, 3]])[-1].tolist()
        [2, 3]
        """
        n = len(self)
        i = operator.index(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"request index out of range for a trace of {n} requests")
        return self.flat[self.offsets[i]:self.offsets[i + 1]]

    def __iter__(self):
        return iter(self.sequences())

    def sequences(self):
        """All requests as a list of 1-D int64 views into ``flat``.

        >>> [s.tolist() for s in Trace.from_sequences([[1, 2], [3]]).sequences()]
        [[1, 2], [3]]
        """
        if len(self) == 0:
            return []
        return np.split(self.flat, self.offsets[1:-1])

    @property
    def num_blocks(self):
        """Total number of ids (blocks) over all requests, ``len(flat)``."""
        return len(self.flat)

    def unique_ids(self):
        """Number of distinct ``(namespace, id)`` pairs.

        >>> t = Trace.from_sequences([[1, 2], [1, 2]], namespace=[0, 1])
        >>> t.unique_ids()
        4
        """
        if len(self) == 0:
            return 0
        ns = self.namespace
        if ns.min() == ns.max():
            return int(np.unique(self.flat).size)
        per_block = np.repeat(ns, np.diff(self.offsets))
        return sum(int(np.unique(self.flat[per_block == k]).size) for k in np.unique(ns))

    def summary(self):
        """A dict of headline statistics.

        Keys: ``name``, ``requests``, ``avg_input_tokens``,
        ``avg_output_tokens``, ``total_blocks``, ``unique_ids`` (distinct
        ``(namespace, id)`` pairs), ``block_size`` and ``namespaces``.

        >>> Trace.from_sequences([[1, 2], [1, 3]], name="x", output_tokens=[4, 6]).summary()
        {'name': 'x', 'requests': 2, 'avg_input_tokens': 2.0, 'avg_output_tokens': 5.0,
         'total_blocks': 4, 'unique_ids': 3, 'block_size': 1, 'namespaces': 1}
        """
        n = len(self)
        return {
            "name": self.name,
            "requests": n,
            "avg_input_tokens": float(self.input_tokens.mean()) if n else 0.0,
            "avg_output_tokens": float(self.output_tokens.mean()) if n else 0.0,
            "total_blocks": self.num_blocks,
            "unique_ids": self.unique_ids(),
            "block_size": self.block_size,
            "namespaces": int(np.unique(self.namespace).size),
        }

    def __repr__(self):
        return (f"Trace(name={self.name!r}, requests={len(self)}, blocks={self.num_blocks}, "
                f"block_size={self.block_size})")



def _offsets(lengths):
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out
