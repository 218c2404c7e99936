"""Every Numba kernel of radix_soa, one module per job.

Kernels take unpacked arrays or the tree tuple ``T`` (never a Python
object), never allocate persistent arrays and never raise. A tree kernel
that runs out of room returns the ``ROOM`` status with its need in ``meta``
(see ``layout``), changing nothing of the item it stopped at, and
``radix_soa._tree.storage.resume`` grows and calls again, for every caller. (The
array baselines' batch kernels keep their own convention: they return the
item they stopped at.)

The modules, one per job, are listed bottom up once, in the kernels row of
the layer table of ``docs/design.md`` (``tests/test_layers.py`` checks that
it names every file here, and that a module imports only modules before it
in that list); each module's docstring ends with its call graph.
``kernel_modules()`` lists the files.

Numba's on-disk cache (``cache=True``) keys a kernel by its own file only: a
change to a callee in another module does not invalidate the caller's cached
machine code. The test suite therefore compiles into a cache directory named
by a hash of every file of this package (``kernel_source_hash``; see
``conftest.py``), so a stale kernel can never be tested; an installed
release is safe because an upgrade rewrites every file.
"""

import hashlib
from pathlib import Path


def kernel_modules():
    """The names of the kernel modules, from the files of this package."""
    return sorted(p.stem for p in Path(__file__).parent.glob("*.py") if p.stem != "__init__")


def kernel_source_hash():
    """A short hash of the source of every kernel module (cache keying)."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]
