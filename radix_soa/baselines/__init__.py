"""What radix_soa is measured and tested against, public so that users can
compare too: the pure-Python object radix tree (``reference``), prefix
cache (``reference_prefix``), replay (``replay_reference``) and cluster
replay (``cluster_reference``), and two array structures in the tree's own
style (``arrays``: a per-token trie and a whole-sequence hash set). They import only the product's input handling,
result types and (for ``arrays``) kernels.
"""
