"""The one validator for integer arguments (sizes, capacities, windows), used
by the constructors, ``replay`` and the command line alike.

>>> check_int("page_size", 16, minimum=1)
16
>>> check_int("page_size", 2.0, minimum=1)
Traceback (most recent call last):
...
TypeError: page_size must be an int; got float 2.0
>>> check_int("window", 0, minimum=1)
Traceback (most recent call last):
...
ValueError: window must be >= 1; got 0
"""

import operator

# Limits of the layout (int32 node lengths and ids, int64 counters).
MAX_SEQUENCE_TOKENS = 2**31 - 1   # a node's span is an int32 length
MAX_NODES = 2**31 - 2             # node ids are int32
MAX_COUNT = 2**63 - 1             # capacities and token counts are int64
MAX_PAGE = 2**31 - 1


def check_int(name, value, minimum=None, maximum=MAX_COUNT):
    """``value`` as an int, or ``TypeError`` (not an integer: floats, strings
    and bools are refused even when integral) / ``ValueError`` (below
    ``minimum``) / ``OverflowError`` (above ``maximum``), naming ``name``."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int; got bool {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int; got {type(value).__name__} {value!r}") from None
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {v}")
    if maximum is not None and v > maximum:
        raise OverflowError(f"{name} must be <= {maximum}; got {v}")
    return v


def check_length(n, what="a sequence"):
    """``OverflowError`` unless ``n`` tokens fit one node's span."""
    if n > MAX_SEQUENCE_TOKENS:
        raise OverflowError(f"{what} of {n} tokens is longer than the {MAX_SEQUENCE_TOKENS} "
                            "tokens a tree can store in one sequence")


def check_policy(name):
    """The number of eviction policy ``name`` (see
    ``radix_soa._kernels.layout.POLICIES``), or ``ValueError`` naming them."""
    from .._kernels.layout import POLICIES

    if not isinstance(name, str) or name not in POLICIES:
        raise ValueError(f"eviction_policy must be one of {', '.join(POLICIES)}; got {name!r}")
    return POLICIES.index(name)
