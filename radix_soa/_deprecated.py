"""Old import paths that moved when the package was layered (0.2): each
old module is a two-line shim calling ``moved``, which warns once and
replaces itself with the new module, so every name (public or private) of
the new module answers under the old path. They go in 0.3.

>>> import warnings, importlib, sys
>>> _ = sys.modules.pop("radix_soa.schedule", None)
>>> with warnings.catch_warnings(record=True) as w:
...     warnings.simplefilter("always")
...     old = importlib.import_module("radix_soa.schedule")
>>> old is importlib.import_module("radix_soa.studies.schedule"), w[0].category.__name__
(True, 'DeprecationWarning')
"""

import importlib
import sys
import warnings

REMOVED_IN = "0.3"
MOVES = {
    "radix_soa.reference": "radix_soa.baselines.reference",
    "radix_soa.reference_prefix": "radix_soa.baselines.reference_prefix",
    "radix_soa.replay_reference": "radix_soa.baselines.replay_reference",
    "radix_soa.simulate": "radix_soa.studies.replay",
    "radix_soa.traces": "radix_soa.studies.traces",
    "radix_soa.workloads": "radix_soa.studies.workloads",
    "radix_soa.schedule": "radix_soa.studies.schedule",
    "radix_soa.footprint": "radix_soa.studies.footprint",
}


def _importer_stacklevel():
    """``stacklevel`` that points the warning at the code doing the import
    (past this module, the shim and importlib's frames)."""
    level = 1
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not (name in MOVES or name == __name__ or "importlib" in frame.f_code.co_filename):
            return level
        frame = frame.f_back
        level += 1
    return 2


def moved(old):
    """Warn that ``old`` moved and make it an alias of its new module."""
    new = MOVES[old]
    warnings.warn(f"{old} is deprecated and will be removed in radix_soa {REMOVED_IN}; "
                  f"import {new} instead", DeprecationWarning, stacklevel=_importer_stacklevel())
    module = importlib.import_module(new)
    sys.modules[old] = module
    return module
