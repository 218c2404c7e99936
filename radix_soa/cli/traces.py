"""``radix-soa traces``: the public traces the loaders read (where each
comes from, its format and license), and ``radix-soa traces get NAME --to
DIR [--from DIR|URL]`` to download (or copy) one into ``DIR/NAME/``,
checked before it is kept."""

import sys

from ..studies import catalog
from .args import PROG, UsageError
from .progress import progress_enabled


def traces(args):
    if args.action is None:
        print(catalog.describe())
        print(f"\nget one with: {PROG} traces get NAME --to DIR (its files go in DIR/NAME/); "
              f"then {PROG} study --trace PATH, the path it suggests (the format is detected)")
        return 0
    if args.to is None:
        raise UsageError("traces get needs --to DIR (where to put the files)")
    try:
        trace = catalog.find(args.name)
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None
    show = progress_enabled(args.progress)

    def report(name, done, total):
        if show:
            of = f" of {total / 1e6:.1f}" if total else ""
            sys.stderr.write(f"\r{PROG}: {name}: {done / 1e6:.1f}{of} MB")
            sys.stderr.flush()

    try:
        paths = catalog.get(trace.name, args.to, base=args.mirror, progress=report)
    finally:
        if show:
            sys.stderr.write("\n")
    for p in paths:
        print(p)
    target = paths[0].parent if len(paths) > 1 else paths[0]
    print(f"checked ({'SHA-256' if trace.files[0].sha256 else 'git blob id'}); study it with: "
          f"{PROG} study --trace {target}", file=sys.stderr)
    return 0
