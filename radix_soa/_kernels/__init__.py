"""Every Numba kernel of radix_soa, one module per job.

Kernels take unpacked arrays or the tree tuple ``T`` (never a Python
object), never allocate persistent arrays and never raise. A tree kernel
that runs out of room returns the ``ROOM`` status with its need in ``meta``
(see ``layout``), changing nothing of the item it stopped at, and
``radix_soa._tree.storage.resume`` grows and calls again, for every caller. (The
array baselines' batch kernels keep their own convention: they return the
item they stopped at.)

Modules, bottom up (a module calls only those above it in this list)::

    notice      the one line printed before the first kernel compiles
    config      the decorators (kernel, kernel_alloc, kernel_parallel, kernel_nogil,
                kernel_scratch)
    prefetch    prefetch (a cache hint; an intrinsic)
    scan        count_zero_one (input checks)
    text        skip_space -> int_list (a JSON array of integers: the router service's tokens)
    layout      Tree fields and index constants, meta slots, load limit, statuses
    table       mix64, key_hash, tag_of -> entry_of, retarget, child_tagged, is_child,
                tag_scan -> probe_on -> find_child; node_hash -> table_put, table_slot,
                table_delete_slot, table_rebuild; term bitmap; has_room, need_room
    heap        heap_less -> sift_up/sift_down -> heap_push, heap_remove, heap_top (a stale
                top moved down first), rekey -> touch, touch_insert
    descent     common -> descend -> exists_one, match_one; settle, refill ->
                descend_lanes (GROUP queries interleaved, prefetched) ->
                exists_batch(_parallel), match_batch(_parallel); descend_group
                (a group's descents, for radix_insert_batch)
    mutation    alloc_node, free_node, new_root; copy_run; split, new_leaf -> extend
                -> insert_one -> radix_insert; descend_group, descend, extend ->
                radix_insert_batch; set_terminal;
                unlink, merge_room, merge_into_child -> remove_one
    chunks      pointer_like (an intrinsic) -> view_at -> chunk_offsets -> chunks_scan,
                chunks_range; descend_lanes -> descend_chunks(_parallel);
                radix_insert_batch -> insert_chunks (a chunked Arrow column in place)
    walks       children_csr -> compact_spans; sorted_children, dfs_terminals
                -> collect_sequences
    ids         ids_one -> ids_batch (sequence ids); sequence_of
    chain       page_content -> page_hash -> chain_hashes, log_stored, log_removed
                (the KV event log)
    snapshot    snapshot_runs (children_csr, page_hash): a prefix cache's pages as stored
                runs, parents first (PrefixCache.snapshot_events)
    prefix      pc_match -> pc_match_one, pc_match_batch; path_values;
                path_unlocked, room_needed, evict_keeping (pc_lock, pc_evict)
                -> insert_capped -> pc_insert_one; pc_evict -> pc_evict_one
    lifecycle   begin_at, checkpoint_at, finish_at (the request transitions on T) ->
                req_begin, req_checkpoint, req_finish, req_abort
    lifecycle_batch  row_at (a request's state row); the per-request checks -> req_begin_batch,
                req_cache_batch (a scheduler step, all or nothing: _undo from a copy)
    replay      lex_less -> dfs_order; lpm_pick; host_store (insert_capped);
                request_of -> replay_run (pc_match, room_needed, pc_lock,
                heap_top, pc_evict, extend)
    router      rx_find; rx_classify (an event's pages: to add, held, unknown ...);
                _add_one -> rx_add; rx_store (rx_classify, _add_one), rx_remove
                (rx_classify, rx_drop): the common event in one call; rx_drop, rx_clear,
                rx_forget (the byte budget); overlap_at (page_hash, prefetch, the
                budget's stamps) -> rx_overlap, rx_overlap_batch (RouterIndex)
    cluster     prefix_hashes; the event heap (ev_push, ev_pop) -> retire; least_loaded,
                shortest_queue -> cache_aware_pick, kv_overlap_pick; approx_insert,
                approx_evict, serve -> cluster_run (tree_at per worker row)
    baselines   the array baselines' kernels (token trie, sequence hash set)

Numba's on-disk cache (``cache=True``) keys a kernel by its own file only: a
change to a callee in another module does not invalidate the caller's cached
machine code. The test suite therefore compiles into a cache directory named
by a hash of every file of this package (``kernel_source_hash``; see
``conftest.py``), so a stale kernel can never be tested; an installed
release is safe because an upgrade rewrites every file.
"""

import hashlib
from pathlib import Path


def kernel_source_hash():
    """A short hash of the source of every kernel module (cache keying)."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]
