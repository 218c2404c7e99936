"""Test-session setup that must run before Numba is imported.

Numba's on-disk cache does not notice a change in a kernel's callee defined
in another file, so the suite compiles into a cache directory named by a
hash of every kernel module's source: an edited kernel package always gets a
fresh cache, and a stale kernel is never tested. ``NUMBA_CACHE_DIR``, when
set, is the parent of that directory.
"""

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

_ROOT = Path(__file__).resolve().parent


def _kernel_hash():
    # radix_soa/_kernels/__init__.py imports nothing heavy: load it alone,
    # without importing radix_soa (which would import Numba first)
    spec = importlib.util.spec_from_file_location(
        "_radix_soa_kernel_hash", _ROOT / "radix_soa" / "_kernels" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.kernel_source_hash()


if "numba" in sys.modules:
    raise RuntimeError("numba was imported before conftest.py could key its cache directory "
                       "by the kernel sources; do not import radix_soa from a plugin")
_leaf = f"kernels-{_kernel_hash()}"
_given = os.environ.get("NUMBA_CACHE_DIR")
# pytest-xdist's workers inherit the controller's already-keyed directory:
# key it once, or the workers compile into a nested copy no other process finds
if not (_given and os.path.basename(os.path.normpath(_given)) == _leaf):
    _parent = _given or os.path.join(tempfile.gettempdir(), "radix_soa-numba-cache")
    os.environ["NUMBA_CACHE_DIR"] = os.path.join(_parent, _leaf)

# the deprecated import shims warn on import: they are tested on purpose in
# tests/test_layers.py, not collected as doctest modules
collect_ignore = [str(_ROOT / "radix_soa" / (name + ".py")) for name in (
    "reference", "reference_prefix", "replay_reference", "simulate", "traces", "workloads",
    "schedule", "footprint")]
