"""KV events as vLLM shapes them: the event types (``kv_events``), vLLM's
``sha256_cbor`` block hash (``block_hash``) and a cache's queue of events
written by the kernels (``event_log``).

This file imports nothing: each caller imports the module it needs.
"""
