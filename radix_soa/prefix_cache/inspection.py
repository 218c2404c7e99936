"""Looking into a ``PrefixCache``: ``check_invariants``, the cached values
(to audit a slot pool) and the tree as text."""

from typing import TYPE_CHECKING, Dict, List

import numpy as np

from .._tree.invariants import check_tree
from .._tree.results import InvariantError
from .._tree.storage import roots_and_depths, span_positions

if TYPE_CHECKING:
    from .core import PrefixCache


def check_invariants(self: "PrefixCache", full: bool = True) -> None:
    """Structure, lock accounting (``evictable + locked == total``, locked
    tokens = spans of locked nodes, locks never grow towards the root...)
    and the eviction heap (exactly the unlocked leaves, in heap order)."""
    with self._lock:
        check_tree(self._s, full=full, canonical=False)
        if self.evictable_tokens + self.locked_tokens != self.total_tokens:
            raise InvariantError("evictable + locked tokens == total tokens")
        if self._capacity is not None and self.total_tokens > self._capacity:
            raise InvariantError("total tokens within capacity")
        self._check_requests()
        roots = self._s.roots()
        if (len(roots) != len(self._s.root_ids())
                or any(not 0 <= n < len(self._ns_keys) for n in roots)):
            raise InvariantError("every root keeps the number of a distinct namespace")


def _check_requests(self: "PrefixCache"):
    """Invariant of the open requests (``check_invariants``): the
    in-flight count is their reservations' sum."""
    open_now = self.open_requests()
    if self.inflight_tokens != sum(r.reserved for r in open_now):
        raise InvariantError("in-flight tokens == the open requests' reservations")


def cached_values(self: "PrefixCache") -> np.ndarray:
    """Every value the cache holds (one per cached token, all
    namespaces), in node order: to audit a slot pool for leaks."""
    with self._lock:
        s = self._s
        if not s.has_values:
            raise ValueError("this cache keeps no values (values=False)")
        end = s.node_end
        live = np.flatnonzero(s.length[:end] > 0)
        return s.values[span_positions(s.start[live], s.length[live])]


def to_text(self: "PrefixCache", tokens_shown: int = 6, max_lines: int = 200) -> str:
    """The tree as text, one node per line indented by depth: its first
    tokens, span length, lock count and (leaves) eviction key (``stamp``:
    the last access tick under lru; see ``layout`` for the others).

    >>> from radix_soa import PrefixCache
    >>> pc = PrefixCache(); _ = pc.insert([1, 2, 3], values=[0, 0, 0])
    >>> _ = pc.insert([1, 2, 9], values=[0, 0, 0])
    >>> print(pc.to_text())
    namespace 0 (3 nodes, 4 tokens)
      [1, 2] len=2
        [3] len=1 stamp=1
        [9] len=1 stamp=2
    """
    with self._lock:
        s = self._s
        end = s.node_end
        parent = s.parent[:end]
        live = np.flatnonzero(s.length[:end] > 0)
        kids: Dict[int, List[int]] = {}
        for v in live.tolist():
            kids.setdefault(int(parent[v]), []).append(v)
        first = {v: int(s.tokens[s.start[v]]) for v in live.tolist()}
        every = roots_and_depths(parent.astype(np.int64), s.length[:end] > 0)
        lines = []
        for key, root in self._roots.items():
            sub = self._subtree_deepest_first(root, every)
            lines.append(f"namespace {key!r} ({sub.size} nodes, "
                         f"{int(s.length[sub].astype(np.int64).sum())} tokens)")
            stack = [(c, 1) for c in sorted(kids.get(root, []), key=first.__getitem__, reverse=True)]
            while stack and len(lines) < max_lines:
                v, depth = stack.pop()
                L = int(s.length[v])
                a = int(s.start[v])
                shown = ", ".join(str(int(t)) for t in s.tokens[a:a + min(L, tokens_shown)])
                more = f", ... +{L - tokens_shown}" if L > tokens_shown else ""
                line = f"{'  ' * depth}[{shown}{more}] len={L}"
                if int(s.lock[v]):
                    line += f" lock={int(s.lock[v])}"
                if v not in kids:
                    line += f" stamp={int(s.stamp[v])}"
                lines.append(line)
                stack.extend((c, depth + 1)
                             for c in sorted(kids.get(v, []), key=first.__getitem__, reverse=True))
        if len(lines) >= max_lines:
            lines.append("...")
    return "\n".join(lines)


def pretty_print(self: "PrefixCache", **kwargs: int) -> None:
    """Print ``to_text()``."""
    print(self.to_text(**kwargs))
