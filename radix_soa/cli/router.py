"""``radix-soa router``: the router service (``radix_soa.service``) over
the workers named by ``--worker``, subscribed to their vLLM KV-event
publishers, until SIGINT or SIGTERM."""

import argparse
import os
import re
import sys

from .args import UsageError, int_arg

ID = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")
ENDPOINT = re.compile(r"(tcp|ipc|inproc)://\S+")


def worker_spec(text):
    """``ID``, ``ID=tcp://host:port`` or ``ID=tcp://host:port,replay=tcp://host:port[,topic=T]``
    -> ``(id, endpoint dict or None)``.

    >>> worker_spec("w0=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5558")
    ('w0', {'pub': 'tcp://127.0.0.1:5557', 'replay': 'tcp://127.0.0.1:5558'})
    >>> worker_spec("w1")
    ('w1', None)
    """
    wid, eq, rest = text.partition("=")
    if not ID.fullmatch(wid):
        raise argparse.ArgumentTypeError(
            f"worker id {wid[:40]!r} must be 1-128 letters, digits or _ . : - "
            "(ID or ID=tcp://host:port[,replay=tcp://host:port][,topic=T])")
    if not eq:
        return wid, None
    parts = rest.split(",")
    ep = {"pub": parts[0]}
    for p in parts[1:]:
        k, eq2, v = p.partition("=")
        if k not in ("replay", "topic") or not eq2 or k in ep:
            raise argparse.ArgumentTypeError(
                f"worker {wid}: {p[:40]!r} is not replay=ADDRESS or topic=T (once each)")
        ep[k] = v
    for k in ("pub", "replay"):
        if k in ep and not ENDPOINT.fullmatch(ep[k]):
            raise argparse.ArgumentTypeError(
                f"worker {wid}: the {k} address {ep[k][:40]!r} is not tcp://host:port "
                "(or ipc://, inproc://)")
    return wid, ep


def seconds_arg(flag, low=None):
    """A number of seconds > ``low`` (>= 0 when ``low`` is None)."""
    def parse(text):
        try:
            v = float(text)
        except ValueError:
            v = float("nan")
        if not (v >= 0 if low is None else v > low) or v >= 1e6:
            raise argparse.ArgumentTypeError(f"{flag} must be a number of seconds"
                                             f"{' > 0' if low is not None else ''}; got {text!r}")
        return v
    return parse


def port_arg(text):
    return int_arg(text, 0, 65535)


def fraction(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text[:40]!r}") from None
    if not 0 <= v < 1e18:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text[:40]}")
    return v


def add_parser(sub, bounded, pos_int, size):
    from ..service.app import LOADS, POLICIES
    r = sub.add_parser(
        "router", help="the router service: per-worker overlap and routing over HTTP, from "
                       "the workers' KV events",
        description="Serve POST /overlap, /route, /load, /events and GET /workers, /healthz, "
                    "/metrics over HTTP from a router index fed by each --worker's vLLM "
                    "KV-event publisher (needs the 'router' extra, and 'vllm' for "
                    "subscriptions). Runs until interrupted.")
    r.add_argument("--worker", action="append", type=worker_spec, default=[],
                   metavar="ID[=tcp://HOST:PORT[,replay=tcp://HOST:PORT][,topic=T]]",
                   help="a worker, and its publisher to subscribe to (repeat for each; "
                        "without an address, its events come by POST /events)")
    r.add_argument("--host", default="127.0.0.1", help="address to listen on (default "
                                                        "127.0.0.1)")
    r.add_argument("--port", type=port_arg, default=8000,
                   help="port (default 8000; 0: a free one, announced on stderr)")
    r.add_argument("--page-size", type=bounded(1 << 20), default=16, metavar="P",
                   help="tokens per KV block, as the engines' (default 16)")
    r.add_argument("--event-hash", choices=["fast64", "sha256_cbor"], default="fast64",
                   help="the block hash of the events: sha256_cbor for vLLM's (default fast64)")
    r.add_argument("--event-hash-seed", default=None, metavar="S",
                   help="vLLM's hash seed (PYTHONHASHSEED of the engines) for sha256_cbor")
    r.add_argument("--max-bytes", type=lambda t: size(t, "--max-bytes", minimum=4096),
                   default=None,
                   metavar="B", help="bound the index's memory (e.g. 512MiB)")
    r.add_argument("--policy", choices=list(POLICIES), default="cache_aware",
                   help="the default routing policy of /route (default cache_aware)")
    r.add_argument("--cache-threshold", type=fraction, default=0.5,
                   help="cache_aware: match rate above which the best match wins (0.5)")
    r.add_argument("--balance-abs-threshold", type=fraction, default=32,
                   help="cache_aware: outstanding spread counted as imbalance (32)")
    r.add_argument("--balance-rel-threshold", type=fraction, default=1.1,
                   help="cache_aware: max/min outstanding counted as imbalance (1.1)")
    r.add_argument("--overlap-weight", type=fraction, default=1.0,
                   help="kv_overlap: the weight of prefill blocks in the cost (1.0)")
    r.add_argument("--load", choices=list(LOADS), default="requests",
                   help="least_loaded: outstanding requests or tokens (default requests)")
    r.add_argument("--prefix-pages", type=bounded(1 << 16), default=4,
                   help="prefix_hash: pages hashed (default 4)")
    r.add_argument("--vnodes", type=bounded(1 << 16), default=64,
                   help="prefix_hash: ring points per worker (default 64)")
    r.add_argument("--allow-new-workers", action="store_true",
                   help="let POST /events add a worker not given by --worker (default: a 400)")
    r.add_argument("--max-workers", type=bounded(1 << 16), default=1024,
                   help="POST /events adds no worker past this many (default 1024)")
    r.add_argument("--max-body", type=lambda t: size(t, "--max-body"), default=64 << 20,
                   help="a request body larger than this is refused (413) before it is read "
                        "(default 64M)")
    r.add_argument("--probe-every", type=seconds_arg("--probe-every"), default=2.0,
                   metavar="SECONDS", help="a subscribed worker quiet this long is probed "
                   "through its replay socket, so a lost last batch or an idle restarted "
                   "engine is seen (default 2; 0: never)")
    r.add_argument("--state-dir", default=None, metavar="DIR",
                   help="checkpoint the index and each worker's stream position here and "
                        "resume from them at start (a damaged or foreign checkpoint is refused "
                        "and the router starts empty)")
    r.add_argument("--checkpoint-every", type=seconds_arg("--checkpoint-every", 0), default=5.0,
                   metavar="SECONDS", help="with --state-dir: seconds between checkpoints "
                   "(default 5; and one on a clean stop)")
    r.add_argument("--bootstrap-from", default=None, metavar="URL",
                   help="start from a peer router's GET /snapshot (a replica), then follow the "
                        "same publishers")
    r.add_argument("--replay-timeout", type=seconds_arg("--replay-timeout", 0), default=5.0,
                   metavar="SECONDS", help="a replay silent this long is given up (default 5)")
    r.set_defaults(func=router)
    return r


def router(args):
    import importlib.util
    if importlib.util.find_spec("uvicorn") is None:
        raise UsageError("radix-soa router needs uvicorn: pip install 'radix-soa[router]'")
    from ..service.app import RouterService, restore
    ids = [w for w, _ in args.worker]
    if len(set(ids)) != len(ids):
        dup = next(w for w in ids if ids.count(w) > 1)
        raise UsageError(f"--worker {dup} is given twice")
    if args.event_hash_seed is not None and args.event_hash != "sha256_cbor":
        raise UsageError("--event-hash-seed needs --event-hash sha256_cbor")
    if (args.event_hash == "sha256_cbor" and args.event_hash_seed is None
            and os.environ.get("PYTHONHASHSEED") is None):
        raise UsageError("--event-hash sha256_cbor needs --event-hash-seed S (the engines' "
                         "PYTHONHASHSEED) or PYTHONHASHSEED set: vLLM's NONE_HASH is random "
                         "without it")
    if args.max_bytes is not None and args.max_bytes < 4096:
        raise UsageError(f"--max-bytes must be >= 4096; got {int(args.max_bytes)}")
    source = args.state_dir
    if args.bootstrap_from is not None:
        import tempfile

        from ..service.checkpoint import CheckpointError, fetch
        source = os.path.join(tempfile.mkdtemp(prefix="radix-soa-bootstrap-"), "state")
        try:
            fetch(args.bootstrap_from, source)
        except (CheckpointError, OSError, ValueError) as e:
            raise UsageError(f"--bootstrap-from {args.bootstrap_from}: {e}") from None
    if args.state_dir is not None and os.path.exists(args.state_dir) and \
            not os.path.isdir(args.state_dir):
        raise UsageError(f"--state-dir {args.state_dir} is not a directory")
    if args.state_dir is not None and not os.path.isdir(
            os.path.dirname(os.path.abspath(args.state_dir))):
        raise UsageError(f"--state-dir {args.state_dir}: its parent directory does not exist")
    index, positions, load_error = restore(
        source, ids, page_size=args.page_size, event_hash=args.event_hash,
        event_hash_seed=args.event_hash_seed,
        max_bytes=None if args.max_bytes is None else int(args.max_bytes))
    if load_error is not None:
        sys.stderr.write(f"radix-soa router: {load_error}; starting empty (its workers "
                         "syncing until their replays answer)\n")
    endpoints = {w: ep for w, ep in args.worker if ep is not None}
    subscriber = None
    if endpoints:
        try:
            from ..integrations.vllm import KVEventSubscriber
        except ImportError:
            raise UsageError("subscribing to --worker publishers needs pyzmq and msgpack: "
                             "pip install 'radix-soa[vllm]'") from None
        subscriber = KVEventSubscriber(index, endpoints, replay_timeout=args.replay_timeout,
                                       probe_every=args.probe_every or None,
                                       positions=positions)
    svc = RouterService(index, subscriber=subscriber, policy=args.policy,
                        cache_threshold=args.cache_threshold,
                        balance_abs_threshold=args.balance_abs_threshold,
                        balance_rel_threshold=args.balance_rel_threshold,
                        overlap_weight=args.overlap_weight, load=args.load,
                        prefix_pages=args.prefix_pages, vnodes=args.vnodes,
                        allow_new_workers=args.allow_new_workers,
                        max_workers=args.max_workers, max_body=int(args.max_body),
                        state_dir=args.state_dir, checkpoint_every=args.checkpoint_every)
    svc.load_error = load_error

    def announce(port):
        sys.stderr.write(f"radix-soa router: listening on http://{args.host}:{port} "
                         f"({len(ids)} workers, {len(endpoints)} subscribed, policy "
                         f"{args.policy})\n")
        sys.stderr.flush()
    try:
        svc.serve_forever(args.host, args.port, announce)
    except OSError as e:  # a port in use, an address not of this machine
        raise UsageError(f"cannot listen on {args.host}:{args.port}: "
                         f"{e.strerror or e}") from None
    finally:
        if subscriber is not None:
            subscriber.close()
    return 0
