"""The hooks ``TreeCache`` calls to save and load a ``PrefixCache``
(``radix_soa._tree.base``): what the header keeps beyond the arrays, and
its checked restore."""

from typing import TYPE_CHECKING

from .._kernels.layout import M_INFLIGHT, M_POLICY, POLICIES
from .._tree.results import TreeFormatError

if TYPE_CHECKING:
    from .core import PrefixCache


def _extra_state(self: "PrefixCache"):
    return {"capacity": self._capacity, "page_size": self._page,
            "count_inflight": self._count_inflight,
            "namespaces": list(self._ns_keys), "handle_salt": self._salt}


def _restore_state(self: "PrefixCache", state):
    s = self._s
    capacity = state.get("capacity")
    if capacity is not None and (type(capacity) is not int or capacity < s.count("tokens")):
        raise TreeFormatError(f"the saved capacity {capacity!r} is not an int at least the "
                              f"{s.count('tokens')} tokens the tree holds")
    if state.get("page_size", s.page_size) != s.page_size:
        raise TreeFormatError("the saved page size disagrees with the tree's")
    if not 0 <= int(s.meta[M_POLICY]) < len(POLICIES):
        raise TreeFormatError(f"the eviction policy number {int(s.meta[M_POLICY])} is not "
                              f"one of the {len(POLICIES)} policies")
    salt = state.get("handle_salt", 0)  # version 1: plain handles
    if type(salt) is not int or not 0 <= salt < 2**32:
        raise TreeFormatError(f"the saved handle salt {salt!r} is not a 32-bit int")
    self._salt = salt
    self._capacity = capacity
    self._cap = -1 if capacity is None else capacity
    self._count_inflight = bool(state.get("count_inflight", False))
    s.meta[M_INFLIGHT] = 0  # requests do not outlive their process (their locks do)
    self._requests = {}
    self._epoch = object()  # requests copied along with the cache are void
    self._page = s.page_size
    if "namespaces" in state:
        keys = state["namespaces"]
        pairs = None
    else:  # format version 1: roots listed in the header; statistics there too
        pairs = [(ns, int(r)) for ns, r in state.get("roots", [[0, s.root]])]
        keys = [ns for ns, _ in pairs]
        s.set_stats(state.get("stats", {}))
    if not isinstance(keys, list) or not keys or not all(
            type(k) in (int, str) for k in keys) or len(set(keys)) != len(keys):
        raise TreeFormatError("the saved namespaces are not a list of distinct ints and strs")
    self._ns_keys = list(keys)
    self._ns_number = {k: i for i, k in enumerate(keys)}
    if pairs is not None:
        if sorted(r for _, r in pairs) != s.root_ids().tolist():
            raise TreeFormatError("the saved namespace roots are not the tree's roots")
        start = s.start.copy()  # record each root's namespace in the arrays, as now
        for i, (_, r) in enumerate(pairs):
            start[r] = i
        s._publish(s.tree._replace(start=start))
    ids = s.root_ids()
    roots = s.roots()
    if (any(not 0 <= n < len(keys) for n in roots) or len(roots) != len(ids)
            or len(ids) != s.count("roots")):
        raise TreeFormatError("the roots do not name distinct namespaces the header lists")
    self._roots = {keys[n]: r for n, r in sorted(roots.items())}
