"""Node handles and namespaces of ``PrefixCache``: a namespace's root, a
handle's encoding (``((generation ^ salt) << 32) | node id``: the
generation tells a live node from a freed and reused id, the per-cache salt
a handle of this cache from one of another), and what takes a handle:
``lock`` / ``unlock`` / ``locked`` and ``touch``."""

import contextlib
import operator
from typing import TYPE_CHECKING, Iterator

import numpy as np

from .._kernels import prefix as prefix_kernels
from .._kernels.layout import DONE
from .._tree.status import LOCK, TOUCH, status_error

if TYPE_CHECKING:
    from .core import PrefixCache

GEN_SHIFT = 32
ID_MASK = (1 << GEN_SHIFT) - 1


def _root(self: "PrefixCache", namespace, create=True):
    """``(root id, 0)`` of ``namespace``, or ``(-1, number)`` when it has
    no root yet: the kernel that needs one makes it, with the namespace's
    number in its ``start``, so a namespace is created in the same call
    that first uses it (and the arrays always say which roots exist).
    ``create=False`` (readers, without the lock) gives ``(-1, -1)`` for a
    namespace without a root and numbers nothing."""
    if type(namespace) is int or type(namespace) is str:  # the common case, fast
        root = self._roots.get(namespace)
        if root is not None:
            return root, 0
    elif namespace is None:  # the default namespace (SGLang's extra_key=None)
        return self._root(0, create)
    if not isinstance(namespace, str):
        try:
            namespace = operator.index(namespace)
        except TypeError:
            raise TypeError("a namespace must be an int or a str; got "
                            f"{type(namespace).__name__}") from None
    self._roots_in_sync()
    root = self._roots.get(namespace)
    if root is not None:
        return root, 0
    if not create:
        return -1, -1
    number = self._ns_number.get(namespace)
    if number is None:
        self._ns_keys.append(namespace)  # an unused number is harmless
        number = len(self._ns_keys) - 1
        self._ns_number[namespace] = number
    return -1, number


def _roots_in_sync(self: "PrefixCache"):
    """Re-read the roots from the arrays if a call that made one did not
    get to record it (it was interrupted after its kernel)."""
    if self._s.count("roots") != len(self._roots):
        keys = self._ns_keys
        self._roots = {keys[n]: r for n, r in sorted(self._s.roots().items())}


def _handle(self: "PrefixCache", v, gen):
    return ((int(gen) ^ self._salt) << GEN_SHIFT) | int(v)


def _handles(self: "PrefixCache", v, gen):
    """``_handle`` of int64 arrays of ids and generations, as uint64 (a
    handle takes 64 bits)."""
    return ((gen.astype(np.uint64) ^ np.uint64(self._salt)) << np.uint64(GEN_SHIFT)) \
        | v.astype(np.uint64)


def _handle_of(self: "PrefixCache", v):
    """The handle of live node ``v``."""
    return self._handle(v, self._s.gen[v])


def _split_handle(self: "PrefixCache", node):
    """``(node id, generation)`` of a handle (``(-1, 0)``: none can be
    live), or ``TypeError`` for a non-integer."""
    if type(node) is not int:
        try:
            if isinstance(node, bool):
                raise TypeError
            node = operator.index(node)
        except TypeError:
            raise TypeError(f"a node handle is an int; got {type(node).__name__}") from None
    v, gen = node & ID_MASK, (node >> GEN_SHIFT) ^ self._salt
    if node < 0 or gen >= 1 << GEN_SHIFT:
        return -1, 0
    return v, gen


def lock(self: "PrefixCache", node: int) -> int:
    """Protect the path root..``node`` from eviction (a reference count:
    each ``lock`` needs its ``unlock``); returns the tokens it newly
    locked (0 when the path was locked already, or for a root).

    >>> from radix_soa import PrefixCache
    >>> pc = PrefixCache(); h = pc.insert([1, 2, 3], values=[4, 5, 6]).node
    >>> pc.lock(h), pc.lock(h), pc.unlock(h), pc.unlock(h)
    (3, 0, 0, 3)
    """
    return self._lock_handle(node, 1)


def unlock(self: "PrefixCache", node: int) -> int:
    """Release one ``lock`` of ``node``: returns the tokens it made
    evictable again; ``ValueError`` if the node holds no lock of its own."""
    return self._lock_handle(node, -1)


def _lock_handle(self: "PrefixCache", node, delta):
    s = self._s
    if s.readonly:
        self._writable()
    if type(node) is int and 0 <= node < 1 << 64:  # _split_handle's common case, inline
        v, gen = node & ID_MASK, (node >> GEN_SHIFT) ^ self._salt
    else:
        v, gen = self._split_handle(node)
    with self._lock:
        if self._readers:
            self._drain_readers()
        s = self._s  # under the lock: a reset() may have replaced it
        status, tokens = prefix_kernels.lock_handle(s.directory, s.like, v, gen, delta)
    if status != DONE:
        raise status_error(LOCK, status, self, node, delta, s.lock)
    return tokens


def touch(self: "PrefixCache", node: int) -> None:
    """Refresh the recency of the path root..``node`` (as a ``match``
    ending there would, without the statistics)."""
    self._writable()
    v, gen = self._split_handle(node)
    with self._writing:
        status = prefix_kernels.pc_touch(self._s.directory, self._s.like, v, gen)
    if status != DONE:
        raise status_error(TOUCH, status, self, node)


@contextlib.contextmanager
def locked(self: "PrefixCache", node: int) -> Iterator[int]:
    """``lock(node)`` for the ``with`` block, ``unlock`` after it (also
    on an exception).

    >>> from radix_soa import PrefixCache
    >>> pc = PrefixCache(); h = pc.insert([1, 2], values=[3, 4]).node
    >>> with pc.locked(h):
    ...     pc.evict(10).num_tokens
    0
    >>> pc.evict(10).num_tokens
    2
    """
    self.lock(node)
    try:
        yield node
    finally:
        self.unlock(node)
