"""``radix_soa.service``: the router service (``radix-soa router``), an
HTTP front of a ``RouterIndex`` fed by the workers' KV events, answering
per-worker overlap and the worker a request should go to (optional extra
``router``: uvicorn, httptools, uvloop). ``app`` holds the service, ``schema`` the request
checks, ``metrics`` the Prometheus text, ``loadgen`` and ``loadtest`` the
bounded loopback load test."""

from .app import POLICIES, RouterService

__all__ = ["RouterService", "POLICIES"]
