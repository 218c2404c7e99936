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


def check_int(name, value, minimum=None):
    """``value`` as an int, or ``TypeError`` (not an integer: floats, strings
    and bools are refused even when integral) / ``ValueError`` (below
    ``minimum``), naming ``name``."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int; got bool {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int; got {type(value).__name__} {value!r}") from None
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {v}")
    return v
