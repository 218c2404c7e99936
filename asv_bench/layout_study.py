"""Issue 27, decision 1: child-table and node-record layouts for the short
workload's serial ``exists_batch``, measured side by side on one tree.

    python asv_bench/layout_study.py [N]     # N short sequences (default 10^6)

Each variant answers ``exists`` for every stored sequence (in insertion
order, then shuffled) with the product's lane walk (GROUP queries
interleaved, prefetched in rounds), over the same tree's nodes, with the
product's key hash; only the layout differs:

- ``pid+sep``: entries ``parent << 32 | id`` (format 3), separate
  ``start``/``length``/``parent`` arrays;
- ``pid+rec``: those entries, the node record ``(start, length << 32 |
  parent)`` in one 16-byte row;
- ``tag+sep``: entries ``tag << 32 | id`` (format 4, this branch), separate
  arrays: a probe compares tags, a candidate is confirmed by ``parent`` and
  its first token;
- ``tag+rec``: tagged entries and the record;
- ``key+rec``: 16-byte slots ``(parent << 32 | id, first token)`` (the exact
  key beside the entry: twice the table's bytes) and the record.

``product`` is ``radix_soa``'s own kernel on its own table. Every variant's
answers are checked against it; timings are interleaved rounds, best of 9
and medians, in ns per query token, with the floor (a Numba loop comparing
the same tokens with a copy) as in ``bench.py scale``. The variants' kernels
live here, not in ``radix_soa._kernels``: they are a study, not the product.
"""
import sys, time, os
import numpy as np
from numba import njit
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchmarks import common
import radix_soa
from radix_soa._kernels.prefetch import prefetch
from radix_soa._kernels.table import mix64, term_get
from radix_soa._kernels.descent import common as span_common

U = np.uint64
EMPTY = -1
GROUP = 16

@njit(inline="always")
def h1(p, t):
    # one splitmix round over parent and first token
    return mix64((np.uint64(np.int64(p)) * np.uint64(0x9E3779B97F4A7C15)) ^ np.uint64(np.int64(t)))

@njit(inline="always")
def h2(p, t):
    h = mix64(np.uint64(np.int64(p)) + np.uint64(0x9E3779B97F4A7C15))
    return mix64(h ^ np.uint64(np.int64(t)))

# --- builds -----------------------------------------------------------------
@njit
def build_fp(table, tokens, start, length, parent, end, onemix):
    mask = table.shape[0] - 1
    for c in range(end):
        if length[c] > 0 and parent[c] >= 0:
            h = h1(parent[c], tokens[start[c]]) if onemix else h2(parent[c], tokens[start[c]])
            i = np.int64(h & np.uint64(mask))
            while table[i] != EMPTY:
                i = (i + 1) & mask
            table[i] = (np.int64(h >> np.uint64(32)) << 32) | c

@njit
def build_key(table, tokens, start, length, parent, end, onemix):
    mask = table.shape[0] - 1
    for c in range(end):
        if length[c] > 0 and parent[c] >= 0:
            t = tokens[start[c]]
            h = h1(parent[c], t) if onemix else h2(parent[c], t)
            i = np.int64(h & np.uint64(mask))
            while table[i, 0] != EMPTY:
                i = (i + 1) & mask
            table[i, 0] = (np.int64(parent[c]) << 32) | c
            table[i, 1] = np.int64(t)

# --- variant A: fp table (fp32 | id), record rec[c] = (start, length << 32 | parent)
@njit(nogil=True)
def exists_fp(tokens, rec, term, table, root, flat, offsets, out, onemix):
    n = offsets.shape[0] - 1
    mask = table.shape[0] - 1
    lane = np.empty(GROUP, np.int64); qs = np.empty(GROUP, np.int64); qn = np.empty(GROUP, np.int64)
    v = np.empty(GROUP, np.int64); pos = np.empty(GROUP, np.int64); slot = np.empty(GROUP, np.int64)
    fpv = np.empty(GROUP, np.int64); cand = np.empty(GROUP, np.int64)
    nxt = 0
    live = 0
    for g in range(GROUP):
        lane[g] = -1
        while nxt < n:
            i = nxt; nxt += 1
            a = offsets[i]; m = offsets[i + 1] - a
            if m < 1:
                out[i] = False; continue
            lane[g] = i; qs[g] = a; qn[g] = m; v[g] = root; pos[g] = 0; live += 1
            break
    while live > 0:
        for g in range(GROUP):
            if lane[g] >= 0:
                h = h1(v[g], flat[qs[g] + pos[g]]) if onemix else h2(v[g], flat[qs[g] + pos[g]])
                slot[g] = np.int64(h & np.uint64(mask))
                fpv[g] = np.int64(h >> np.uint64(32))
                prefetch(table, slot[g])
        for g in range(GROUP):
            if lane[g] >= 0:
                i = slot[g]; f = fpv[g]
                c = -1
                e = table[i]
                while e != EMPTY:
                    if (e >> 32) & 0xFFFFFFFF == f:
                        c = e & 0xFFFFFFFF
                        break
                    i = (i + 1) & mask
                    e = table[i]
                slot[g] = i
                cand[g] = c
                if c >= 0:
                    prefetch(rec, 2 * c)
        for g in range(GROUP):
            c = cand[g]
            if lane[g] >= 0 and c >= 0:
                s = rec[2 * c]
                rest = qn[g] - pos[g]
                ln = rec[2 * c + 1] >> 32
                e2 = s + min(ln, rest, 64)
                j = s
                while j < e2:
                    prefetch(tokens, j); j += 8
                if ln == rest:
                    prefetch(term, c >> 3)
        for g in range(GROUP):
            if lane[g] < 0:
                continue
            p = v[g]
            at = qs[g] + pos[g]
            rest = qn[g] - pos[g]
            c = cand[g]
            done = True
            while True:  # a fingerprint match is checked by the record
                if c < 0:
                    out[lane[g]] = False
                    break
                pl = rec[2 * c + 1]
                if (pl & 0xFFFFFFFF) == p and tokens[rec[2 * c]] == flat[at]:
                    break
                # false positive: probe on
                i = (slot[g] + 1) & mask
                c = -1
                e = table[i]
                while e != EMPTY:
                    if (e >> 32) & 0xFFFFFFFF == fpv[g]:
                        c = e & 0xFFFFFFFF
                        break
                    i = (i + 1) & mask
                    e = table[i]
                slot[g] = i
            if c >= 0:
                L = rec[2 * c + 1] >> 32
                k = 1 + span_common(tokens, rec[2 * c] + 1, flat, at + 1, min(L, rest) - 1)
                if k == L:
                    v[g] = c
                    pos[g] += L
                    if qn[g] - pos[g] >= 1:
                        done = False
                    else:
                        out[lane[g]] = term_get(term, c) == 1
                else:
                    out[lane[g]] = False
            if done:
                lane[g] = -1
                live -= 1
                while nxt < n:
                    i = nxt; nxt += 1
                    a = offsets[i]; m = offsets[i + 1] - a
                    if m < 1:
                        out[i] = False; continue
                    prefetch(flat, a)
                    lane[g] = i; qs[g] = a; qn[g] = m; v[g] = root; pos[g] = 0; live += 1
                    break

@njit(nogil=True)
def exists_fps(tokens, start, length, parent, term, table, root, flat, offsets, out, onemix):
    n = offsets.shape[0] - 1
    mask = table.shape[0] - 1
    lane = np.empty(GROUP, np.int64); qs = np.empty(GROUP, np.int64); qn = np.empty(GROUP, np.int64)
    v = np.empty(GROUP, np.int64); pos = np.empty(GROUP, np.int64); slot = np.empty(GROUP, np.int64)
    fpv = np.empty(GROUP, np.int64); cand = np.empty(GROUP, np.int64)
    nxt = 0
    live = 0
    for g in range(GROUP):
        lane[g] = -1
        while nxt < n:
            i = nxt; nxt += 1
            a = offsets[i]; m = offsets[i + 1] - a
            if m < 1:
                out[i] = False; continue
            lane[g] = i; qs[g] = a; qn[g] = m; v[g] = root; pos[g] = 0; live += 1
            break
    while live > 0:
        for g in range(GROUP):
            if lane[g] >= 0:
                h = h1(v[g], flat[qs[g] + pos[g]]) if onemix else h2(v[g], flat[qs[g] + pos[g]])
                slot[g] = np.int64(h & np.uint64(mask))
                fpv[g] = np.int64(h >> np.uint64(32))
                prefetch(table, slot[g])
        for g in range(GROUP):
            if lane[g] >= 0:
                i = slot[g]; f = fpv[g]
                c = -1
                e = table[i]
                while e != EMPTY:
                    if (e >> 32) & 0xFFFFFFFF == f:
                        c = e & 0xFFFFFFFF
                        break
                    i = (i + 1) & mask
                    e = table[i]
                slot[g] = i
                cand[g] = c
                if c >= 0:
                    prefetch(start, c); prefetch(length, c); prefetch(parent, c)
        for g in range(GROUP):
            c = cand[g]
            if lane[g] >= 0 and c >= 0:
                s = start[c]
                rest = qn[g] - pos[g]
                ln = np.int64(length[c])
                e2 = s + min(ln, rest, 64)
                j = s
                while j < e2:
                    prefetch(tokens, j); j += 8
                if ln == rest:
                    prefetch(term, c >> 3)
        for g in range(GROUP):
            if lane[g] < 0:
                continue
            p = v[g]
            at = qs[g] + pos[g]
            rest = qn[g] - pos[g]
            c = cand[g]
            done = True
            while True:  # a fingerprint match is checked by the node
                if c < 0:
                    out[lane[g]] = False
                    break
                if parent[c] == p and tokens[start[c]] == flat[at]:
                    break
                # false positive: probe on
                i = (slot[g] + 1) & mask
                c = -1
                e = table[i]
                while e != EMPTY:
                    if (e >> 32) & 0xFFFFFFFF == fpv[g]:
                        c = e & 0xFFFFFFFF
                        break
                    i = (i + 1) & mask
                    e = table[i]
                slot[g] = i
            if c >= 0:
                L = np.int64(length[c])
                k = 1 + span_common(tokens, start[c] + 1, flat, at + 1, min(L, rest) - 1)
                if k == L:
                    v[g] = c
                    pos[g] += L
                    if qn[g] - pos[g] >= 1:
                        done = False
                    else:
                        out[lane[g]] = term_get(term, c) == 1
                else:
                    out[lane[g]] = False
            if done:
                lane[g] = -1
                live -= 1
                while nxt < n:
                    i = nxt; nxt += 1
                    a = offsets[i]; m = offsets[i + 1] - a
                    if m < 1:
                        out[i] = False; continue
                    prefetch(flat, a)
                    lane[g] = i; qs[g] = a; qn[g] = m; v[g] = root; pos[g] = 0; live += 1
                    break

# --- variant B: keyed table rows (parent<<32|id, key), same record
@njit(nogil=True)
def exists_key(tokens, rec, term, table, root, flat, offsets, out, onemix):
    n = offsets.shape[0] - 1
    mask = table.shape[0] - 1
    lane = np.empty(GROUP, np.int64); qs = np.empty(GROUP, np.int64); qn = np.empty(GROUP, np.int64)
    v = np.empty(GROUP, np.int64); pos = np.empty(GROUP, np.int64); slot = np.empty(GROUP, np.int64)
    cand = np.empty(GROUP, np.int64)
    nxt = 0
    live = 0
    for g in range(GROUP):
        lane[g] = -1
        while nxt < n:
            i = nxt; nxt += 1
            a = offsets[i]; m = offsets[i + 1] - a
            if m < 1:
                out[i] = False; continue
            lane[g] = i; qs[g] = a; qn[g] = m; v[g] = root; pos[g] = 0; live += 1
            break
    while live > 0:
        for g in range(GROUP):
            if lane[g] >= 0:
                h = h1(v[g], flat[qs[g] + pos[g]]) if onemix else h2(v[g], flat[qs[g] + pos[g]])
                slot[g] = np.int64(h & np.uint64(mask))
                prefetch(table, slot[g])  # 2-D: row start
        for g in range(GROUP):
            if lane[g] >= 0:
                i = slot[g]
                p = v[g]
                t = np.int64(flat[qs[g] + pos[g]])
                c = -1
                e = table[i, 0]
                while e != EMPTY:
                    if e >> 32 == p and table[i, 1] == t:
                        c = e & 0xFFFFFFFF
                        break
                    i = (i + 1) & mask
                    e = table[i, 0]
                cand[g] = c
                if c >= 0:
                    prefetch(rec, 2 * c)
        for g in range(GROUP):
            c = cand[g]
            if lane[g] >= 0 and c >= 0:
                s = rec[2 * c]
                rest = qn[g] - pos[g]
                ln = rec[2 * c + 1] >> 32
                e2 = s + min(ln, rest, 64)
                j = s + 1
                while j < e2:
                    prefetch(tokens, j); j += 8
                if ln == rest:
                    prefetch(term, c >> 3)
        for g in range(GROUP):
            if lane[g] < 0:
                continue
            at = qs[g] + pos[g]
            rest = qn[g] - pos[g]
            c = cand[g]
            done = True
            if c < 0:
                out[lane[g]] = False
            else:
                L = rec[2 * c + 1] >> 32
                k = 1 + span_common(tokens, rec[2 * c] + 1, flat, at + 1, min(L, rest) - 1)
                if k == L:
                    v[g] = c
                    pos[g] += L
                    if qn[g] - pos[g] >= 1:
                        done = False
                    else:
                        out[lane[g]] = term_get(term, c) == 1
                else:
                    out[lane[g]] = False
            if done:
                lane[g] = -1
                live -= 1
                while nxt < n:
                    i = nxt; nxt += 1
                    a = offsets[i]; m = offsets[i + 1] - a
                    if m < 1:
                        out[i] = False; continue
                    prefetch(flat, a)
                    lane[g] = i; qs[g] = a; qn[g] = m; v[g] = root; pos[g] = 0; live += 1
                    break



@njit
def build_pid(table, tokens, start, length, parent, end):
    mask = table.shape[0] - 1
    for c in range(end):
        if length[c] > 0 and parent[c] >= 0:
            h = h2(parent[c], tokens[start[c]])
            i = np.int64(h & np.uint64(mask))
            while table[i] != EMPTY:
                i = (i + 1) & mask
            table[i] = (np.int64(parent[c]) << 32) | c


@njit(nogil=True)
def exists_pid(tokens, rec, term, table, root, flat, offsets, out):
    n = offsets.shape[0] - 1
    mask = table.shape[0] - 1
    lane = np.empty(GROUP, np.int64); qs = np.empty(GROUP, np.int64); qn = np.empty(GROUP, np.int64)
    v = np.empty(GROUP, np.int64); pos = np.empty(GROUP, np.int64); slot = np.empty(GROUP, np.int64)
    cand = np.empty(GROUP, np.int64)
    nxt = 0
    live = 0
    for g in range(GROUP):
        lane[g] = -1
        while nxt < n:
            i = nxt; nxt += 1
            a = offsets[i]; m = offsets[i + 1] - a
            if m < 1:
                out[i] = False; continue
            lane[g] = i; qs[g] = a; qn[g] = m; v[g] = root; pos[g] = 0; live += 1
            break
    while live > 0:
        for g in range(GROUP):
            if lane[g] >= 0:
                h = h2(v[g], flat[qs[g] + pos[g]])
                slot[g] = np.int64(h & np.uint64(mask))
                prefetch(table, slot[g])
        for g in range(GROUP):
            if lane[g] >= 0:
                e = table[slot[g]]
                cand[g] = e & 0xFFFFFFFF if e >= 0 and e >> 32 == v[g] else -1
                if cand[g] >= 0:
                    prefetch(rec, 2 * cand[g])
        for g in range(GROUP):
            c = cand[g]
            if lane[g] >= 0 and c >= 0:
                s = rec[2 * c]
                rest = qn[g] - pos[g]
                ln = rec[2 * c + 1] >> 32
                e2 = s + min(ln, rest, 64)
                j = s
                while j < e2:
                    prefetch(tokens, j); j += 8
                if ln == rest:
                    prefetch(term, c >> 3)
        for g in range(GROUP):
            if lane[g] < 0:
                continue
            p = v[g]
            at = qs[g] + pos[g]
            rest = qn[g] - pos[g]
            i = slot[g]
            c = -1
            e = table[i]
            while e != EMPTY:
                if e >> 32 == p:
                    cc = e & 0xFFFFFFFF
                    if tokens[rec[2 * cc]] == flat[at]:
                        c = cc
                        break
                i = (i + 1) & mask
                e = table[i]
            done = True
            if c < 0:
                out[lane[g]] = False
            else:
                L = rec[2 * c + 1] >> 32
                k = 1 + span_common(tokens, rec[2 * c] + 1, flat, at + 1, min(L, rest) - 1)
                if k == L:
                    v[g] = c
                    pos[g] += L
                    if qn[g] - pos[g] >= 1:
                        done = False
                    else:
                        out[lane[g]] = term_get(term, c) == 1
                else:
                    out[lane[g]] = False
            if done:
                lane[g] = -1
                live -= 1
                while nxt < n:
                    i = nxt; nxt += 1
                    a = offsets[i]; m = offsets[i + 1] - a
                    if m < 1:
                        out[i] = False; continue
                    prefetch(flat, a)
                    lane[g] = i; qs[g] = a; qn[g] = m; v[g] = root; pos[g] = 0; live += 1
                    break


@njit(nogil=True)
def exists_pids(tokens, start, length, parent, term, table, root, flat, offsets, out):
    n = offsets.shape[0] - 1
    mask = table.shape[0] - 1
    lane = np.empty(GROUP, np.int64); qs = np.empty(GROUP, np.int64); qn = np.empty(GROUP, np.int64)
    v = np.empty(GROUP, np.int64); pos = np.empty(GROUP, np.int64); slot = np.empty(GROUP, np.int64)
    cand = np.empty(GROUP, np.int64)
    nxt = 0
    live = 0
    for g in range(GROUP):
        lane[g] = -1
        while nxt < n:
            i = nxt; nxt += 1
            a = offsets[i]; m = offsets[i + 1] - a
            if m < 1:
                out[i] = False; continue
            lane[g] = i; qs[g] = a; qn[g] = m; v[g] = root; pos[g] = 0; live += 1
            break
    while live > 0:
        for g in range(GROUP):
            if lane[g] >= 0:
                h = h2(v[g], flat[qs[g] + pos[g]])
                slot[g] = np.int64(h & np.uint64(mask))
                prefetch(table, slot[g])
        for g in range(GROUP):
            if lane[g] >= 0:
                e = table[slot[g]]
                cand[g] = e & 0xFFFFFFFF if e >= 0 and e >> 32 == v[g] else -1
                if cand[g] >= 0:
                    prefetch(start, cand[g]); prefetch(length, cand[g])
        for g in range(GROUP):
            c = cand[g]
            if lane[g] >= 0 and c >= 0:
                s = start[c]
                rest = qn[g] - pos[g]
                ln = np.int64(length[c])
                e2 = s + min(ln, rest, 64)
                j = s
                while j < e2:
                    prefetch(tokens, j); j += 8
                if ln == rest:
                    prefetch(term, c >> 3)
        for g in range(GROUP):
            if lane[g] < 0:
                continue
            p = v[g]
            at = qs[g] + pos[g]
            rest = qn[g] - pos[g]
            i = slot[g]
            c = -1
            e = table[i]
            while e != EMPTY:
                if e >> 32 == p:
                    cc = e & 0xFFFFFFFF
                    if tokens[start[cc]] == flat[at]:
                        c = cc
                        break
                i = (i + 1) & mask
                e = table[i]
            done = True
            if c < 0:
                out[lane[g]] = False
            else:
                L = np.int64(length[c])
                k = 1 + span_common(tokens, start[c] + 1, flat, at + 1, min(L, rest) - 1)
                if k == L:
                    v[g] = c
                    pos[g] += L
                    if qn[g] - pos[g] >= 1:
                        done = False
                    else:
                        out[lane[g]] = term_get(term, c) == 1
                else:
                    out[lane[g]] = False
            if done:
                lane[g] = -1
                live -= 1
                while nxt < n:
                    i = nxt; nxt += 1
                    a = offsets[i]; m = offsets[i + 1] - a
                    if m < 1:
                        out[i] = False; continue
                    prefetch(flat, a)
                    lane[g] = i; qs[g] = a; qn[g] = m; v[g] = root; pos[g] = 0; live += 1
                    break


def main(n, rounds=9):
    from radix_soa._kernels.descent import exists_batch
    import bench
    flat, offsets = common.short_corpus(n)
    rc = radix_soa.RadixCache()
    rc.insert_batch((flat, offsets))
    s = rc._s
    t = s.tree
    end = s.node_end
    shuffled = common.take_csr(flat, offsets, np.random.default_rng(1).permutation(n))
    qtok = int(offsets[-1])
    rec = np.zeros(2 * t.start.shape[0], np.int64)
    rec[0::2] = t.start
    rec[1::2] = (t.length.astype(np.int64) << 32) | (t.parent.astype(np.int64) & 0xFFFFFFFF)
    size = t.table.shape[0]
    nodes = s.count("nodes")
    print(f"{n:,} short sequences: {nodes:,} nodes, {size:,} table slots (load {nodes / size:.2f})")
    floor = bench._compare_floor()
    out = np.empty(n, np.bool_)
    tag = np.full(size, -1, np.int64)
    build_fp(tag, t.tokens, t.start, t.length, t.parent, end, False)
    key = np.full((size, 2), -1, np.int64)
    build_key(key, t.tokens, t.start, t.length, t.parent, end, False)
    pid = np.full(size, -1, np.int64)
    build_pid(pid, t.tokens, t.start, t.length, t.parent, end)
    args = s.exists_args
    for name, q in (("insertion order", (flat, offsets)), ("shuffled", shuffled)):
        copy = q[0].copy()
        want = rc.exists_batch(q, parallel=False)
        V = {"floor": lambda: floor(q[0], copy, q[1], out),
             "product": lambda: exists_batch(*args, s.root, q[0], q[1], out),
             "pid+sep": lambda: exists_pids(t.tokens, t.start, t.length, t.parent, t.term, pid,
                                            s.root, q[0], q[1], out),
             "pid+rec": lambda: exists_pid(t.tokens, rec, t.term, pid, s.root, q[0], q[1], out),
             "tag+sep": lambda: exists_fps(t.tokens, t.start, t.length, t.parent, t.term, tag,
                                           s.root, q[0], q[1], out, False),
             "tag+rec": lambda: exists_fp(t.tokens, rec, t.term, tag, s.root, q[0], q[1], out,
                                          False),
             "key+rec": lambda: exists_key(t.tokens, rec, t.term, key, s.root, q[0], q[1], out,
                                           False)}
        for k, f in V.items():
            if k != "floor":
                f()
                if not np.array_equal(out, want):
                    raise AssertionError(f"{k} disagrees with the product")
        res = {k: [] for k in V}
        for _ in range(rounds):
            for k, f in V.items():
                t0 = time.perf_counter()
                f()
                res[k].append(time.perf_counter() - t0)
        base = res["pid+sep"]
        print(f"  {name}: ns per query token (best / median), x the floor, x pid+sep (format 3)")
        for k, v in res.items():
            print(f"    {k:8s} {min(v) / qtok * 1e9:5.2f} / {np.median(v) / qtok * 1e9:5.2f}  "
                  f"{min(v) / min(res['floor']):5.2f}x floor  {min(base) / min(v):5.2f}x "
                  f"(best)  {np.median(base) / np.median(v):5.2f}x (median)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10**6)
