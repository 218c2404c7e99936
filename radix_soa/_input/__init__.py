"""User input to int64 arrays or ``Batch`` es, or a clear error: one
sequence (``sequence``), Arrow data (``arrow``), any batch (``batch``), the
per-chunk threads and progress of a batch call (``run``), duplicates
(``dedup``), the integer-argument validator (``validate``) and the public
annotations' aliases (``types``).

This file imports nothing: each caller imports the module it needs.
"""
