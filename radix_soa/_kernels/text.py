"""A JSON array of integers read from bytes: the router service's request
bodies carry tokens as one, and reading it here costs about a microsecond
per kilobyte where ``json.loads`` builds a Python int per token.

Call graph (callers after their callees): skip_space -> int_list (a JSON
array of integers: the router service's tokens)
"""

from .config import kernel, kernel_inner


@kernel_inner
def skip_space(buf, i, n):
    while i < n and (buf[i] == 32 or buf[i] == 10 or buf[i] == 13 or buf[i] == 9):
        i += 1
    return i


@kernel
def int_list(buf, start, out):
    """Read the JSON array of integers opening at ``buf[start]`` (a ``[``)
    into ``out`` (room for ``(len(buf) - start) // 2 + 1``). Returns
    ``(count, end)``, ``end`` just past the ``]``; count ``-1`` when the
    text is not a plain array of integers of at most 18 digits (a float,
    a leading zero, a 19-digit number, anything else): the caller's exact
    JSON reader decides those."""
    n = buf.shape[0]
    i = skip_space(buf, start + 1, n)
    if i < n and buf[i] == 93:  # ]
        return 0, i + 1
    k = 0
    while True:
        neg = False
        if i < n and buf[i] == 45:  # -
            neg = True
            i += 1
        if i >= n or buf[i] < 48 or buf[i] > 57:
            return -1, i
        v = 0
        if buf[i] == 48:
            i += 1
            if i < n and buf[i] >= 48 and buf[i] <= 57:
                return -1, i  # a leading zero
        else:
            digits = 0
            while i < n and buf[i] >= 48 and buf[i] <= 57:
                if digits == 18:
                    return -1, i
                v = v * 10 + (int(buf[i]) - 48)
                digits += 1
                i += 1
        if i < n and (buf[i] == 46 or buf[i] == 101 or buf[i] == 69):  # . e E
            return -1, i
        out[k] = -v if neg else v
        k += 1
        i = skip_space(buf, i, n)
        if i >= n:
            return -1, i
        if buf[i] == 93:
            return k, i + 1
        if buf[i] != 44:  # ,
            return -1, i
        i = skip_space(buf, i + 1, n)
