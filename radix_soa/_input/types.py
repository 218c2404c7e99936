"""Type aliases of the public API's annotations.

>>> from radix_soa._input.types import TokenSequence
>>> TokenSequence
typing.Union[typing.Sequence[int], numpy.ndarray]
"""

from typing import Any, Callable, Sequence, Union

import numpy as np

__all__ = ["TokenSequence", "BatchLike", "Namespace", "Parallel", "Progress"]

# one sequence: a list, tuple or range of ints, or a 1-D integer array
TokenSequence = Union[Sequence[int], np.ndarray]
# many sequences: whatever ``radix_soa.pack`` takes (lists, CSR pairs, a
# Batch, Arrow and PyCapsule arrays, polars/pandas columns, datasets, ...)
BatchLike = Any
# a namespace key (None: the default namespace)
Namespace = Union[int, str, None]
# a batch call's thread choice (None: decided per chunk)
Parallel = Union[bool, None]
# a batch call's progress report: False/None, True (a tqdm bar) or progress(done, total)
Progress = Union[bool, None, Callable[[int, int], Any]]
