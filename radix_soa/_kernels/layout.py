"""The shape every kernel shares: the tree's arrays, the counter slots, the
load limit and the status vocabulary.

The tree's arrays travel to kernels as one plain tuple ``T`` in the order of
``TREE_FIELDS``, read by name through the index constants below
(``T[TOKENS]``, ``T[META]``). Python code holds the same arrays as a
``Tree`` named tuple. (A named tuple is not passed to kernels itself: Numba
types it in Python on every call, about 1 µs more than a plain tuple.)

Per node ``v``: ``tokens[start[v]:start[v]+length[v]]`` is its span.

=========  ======  =========================================================
field      dtype   meaning
=========  ======  =========================================================
tokens     any     flat token buffer (int64 by default); spans point into it
values     int64   one value per token, parallel to ``tokens`` (empty: none)
start      int64   span start; for a free node, the next free id
length     int32   span length; ``FREE`` (-1) marks a free node, 0 a root
parent     int32   parent id; -1 for a root (one root per namespace)
nchild     int32   number of children
cxor       int32   XOR of the children's ids (the only child when nchild == 1)
term       uint8   terminal bitmap, one bit per node
table      int64   child hash table keyed by (parent, first page): entries
                   ``tag << 32 | id``, the tag the key hash's high 32 bits;
                   -1 empty
lock       int32   locks on the node's subtree (prefix cache; else empty)
stamp      int64   eviction key: the policy's score, lowest first (prefix cache)
hpos       int32   position in the eviction heap, or -1 (prefix cache)
heap       int32   binary min-heap of evictable leaves (prefix cache)
hkey       int64   the key the heap orders a leaf by: its ``stamp`` when it was
                   last placed, at most its ``stamp`` now (a rise waits until
                   the leaf reaches the top; prefix cache)
gen        uint32  handle generation, bumped when the id is freed
own        int32   locks taken on the node itself (prefix cache)
meta       int64   counters, indexed by the ``M_*`` slots
=========  ======  =========================================================

Call graph (callers after their callees): Tree fields and index constants,
meta slots, load limit, statuses
"""

from collections import namedtuple

Tree = namedtuple("Tree", ["tokens", "values", "start", "length", "parent", "nchild", "cxor",
                           "term", "table", "lock", "stamp", "hpos", "heap", "hkey", "gen",
                           "own", "meta"])
TREE_FIELDS = Tree._fields
(TOKENS, VALUES, START, LENGTH, PARENT, NCHILD, CXOR, TERM, TABLE, LOCK, STAMP, HPOS, HEAP,
 HKEY, GEN, OWN, META) = range(len(TREE_FIELDS))

# arrays with one entry per node id (the terminal bitmap aside)
NODE_FIELDS = ("start", "length", "parent", "nchild", "cxor")
TRACK_FIELDS = ("lock", "stamp", "hpos", "heap", "hkey", "gen", "own")
# what a save keeps of them: ``hkey`` is the heap's working copy of ``stamp``
# (a save writes the heap ordered by ``stamp``, and a load starts hkey == stamp)
SAVED_TRACK_FIELDS = tuple(f for f in TRACK_FIELDS if f != "hkey")

# the dtype of every field but ``tokens`` (the tree's choice), as NumPy names
FIELD_DTYPES = {"values": "int64", "start": "int64", "length": "int32", "parent": "int32",
                "nchild": "int32", "cxor": "int32", "term": "uint8", "table": "int64",
                "lock": "int32", "stamp": "int64", "hpos": "int32", "heap": "int32",
                "hkey": "int64", "gen": "uint32", "own": "int32", "meta": "int64"}

# ---------------------------------------------------------------- meta slots
M_TOK_USED = 0      # high-water mark of the token buffer
M_NODE_END = 1      # high-water mark of node ids
M_FREE_HEAD = 2     # first free node id, or -1
M_FREE_COUNT = 3    # number of free node ids below M_NODE_END
M_NODES = 4         # live non-root nodes (== filled table slots)
M_TOKENS = 5        # tokens held in live node spans
M_TERMINALS = 6     # terminal marks set
M_DEAD_TOKENS = 7   # tokens in the buffer no live span covers
M_HEAP_SIZE = 8     # entries in the eviction heap
M_LOCKED_TOKENS = 9  # tokens in nodes with lock > 0
M_CLOCK = 10        # logical clock of the prefix cache
M_ROOTS = 11        # namespace roots allocated
M_TOKENS_INSERTED = 12  # every token handed to a successful insert (footprint studies)
M_NEED_TOKENS = 13  # after a ROOM status: buffer tokens the call needs
M_NEED_NODES = 14   # after a ROOM status: node ids (and table entries) it needs
# prefix-cache statistics, kept with the tree so a call changes them with it
M_LOOKUPS = 16
M_QUERY_TOKENS = 17
M_HIT_TOKENS = 18
M_NEW_TOKENS = 19   # tokens insert added (not already cached)
M_EVICTED_TOKENS = 20
M_POLICY = 21       # eviction policy (P_* below) of the prefix cache
M_PRIORITY = 22     # priority of the insert in progress (policy "priority")
M_INFLIGHT = 23     # tokens open requests reserve (PrefixCache count_inflight)
META_SIZE = 32
STAT_SLOTS = {"lookups": M_LOOKUPS, "query_tokens": M_QUERY_TOKENS, "hit_tokens": M_HIT_TOKENS,
              "inserted_tokens": M_NEW_TOKENS, "evicted_tokens": M_EVICTED_TOKENS}

FREE = -1           # length of a free node
NO_NODE = -1
EMPTY = -1          # an empty child-table slot (no entry is -1: node ids are < 2^31)
ENTRY_NODE_MASK = (1 << 32) - 1  # the node id bits of a table entry (its tag above)
ENTRY_TAG_MASK = -(1 << 32)      # the tag bits (int64): the key hash's high 32 bits

# the child table is kept at or under this load (LOAD_NUM / LOAD_DEN)
LOAD_NUM = 7
LOAD_DEN = 10
MAX_LOAD = LOAD_NUM / LOAD_DEN

# ---------------------------------------------------------------- statuses
# Every kernel that can run out of room returns one of these (alone, or as
# the first element of a tuple). After ROOM nothing of the current item has
# changed and meta[M_NEED_TOKENS] / meta[M_NEED_NODES] say what to reserve;
# a batch kernel also leaves the item it stopped at in its cursor.
DONE = 0
ROOM = 1
FULL = 2            # cannot fit under the capacity even after evicting all else
STALE = 3           # a node handle whose node is gone (the lock kernel)
LIMIT = 4           # a lock count would pass LOCK_LIMIT (nothing changed)
MISMATCH = 5        # a request's tokens do not start with its cached prefix

# Eviction policies: the heap orders evictable leaves by one int64 key per
# node (``stamp``), lowest first, ties by node id. Each policy packs what it
# scores into the key: lru the last access tick, mru its negation, fifo/filo
# the creation tick (or its negation), lfu ``hits << CLOCK_BITS | last``,
# priority ``(priority + PRIORITY_OFFSET) << CLOCK_BITS | last``, slru as
# lfu with hits saturating at SLRU_PROTECTED (1: probationary, 2: protected).
P_LRU, P_LFU, P_FIFO, P_MRU, P_FILO, P_PRIORITY, P_SLRU = range(7)
POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru")
CLOCK_BITS = 40                 # ticks a packed key can hold (lfu, priority)
CLOCK_MASK = (1 << CLOCK_BITS) - 1
MAX_HITS = (1 << 22) - 1        # lfu hit counts saturate here
SLRU_PROTECTED = 2              # slru: a node reached this often is protected
PRIORITY_OFFSET = 1 << 21       # priorities lie in [-2^21, 2^21)

# Lock counts are int32. A user lock stops one short of the int32 maximum so
# that the guard lock an insert takes on its own path always fits.
LOCK_LIMIT = 2**31 - 2

# ---------------------------------------------------------------- requests
# A PrefixCache request's state: one small int64 array per request that the
# lifecycle kernels write in the same call that changes the tree, so a
# request and the cache can never disagree (not even after an interrupt).
# The R_LAST_* slots keep what the last committed checkpoint/finish did, so
# its result can be recomputed after a fault.
R_PHASE = 0         # NEW, OPEN, FINISHED or ABORTED
R_NODE = 1          # the node the request's prefix ends at ...
R_GEN = 2           # ... and its generation
R_LOCKED = 3        # 1 while the request holds a lock on R_NODE
R_CACHED = 4        # leading tokens cached for the request (grows by checkpoint)
R_BEGUN = 5         # leading tokens found cached at begin (its values)
R_RESERVED = 6      # tokens reserved in flight (count_inflight)
R_FREED = 7         # tokens begin evicted to make room for the reservation
R_STEPS = 8         # transitions committed: begin, each checkpoint, finish/abort
R_LAST_FROM = 9     # R_CACHED before the last checkpoint/finish
R_LAST_CACHED = 10  # leading tokens its insert found cached
R_LAST_N = 11       # whole-page tokens it inserted
R_LAST_FREED = 12   # tokens its insert evicted
R_LAST_NODE = 13
R_LAST_GEN = 14
R_LAST_PARTIAL = 15  # values of the partial last page it handed back (finish)
REQUEST_SIZE = 16
NEW, OPEN, FINISHED, ABORTED = range(4)
