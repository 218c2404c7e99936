"""The tree the caches share: its arrays as one ``Tree`` with all-or-nothing
growth (``storage``), the class both caches derive from with its lock and
save/load (``base``), the saved directory (``persist``), the structural
checks (``invariants``), the public result types and exceptions
(``results``) and the one map from a kernel status to an exception
(``status``).

This file imports nothing: each caller imports the module it needs.
"""
