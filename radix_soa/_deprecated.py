"""Old names kept as deprecated aliases; they go in 0.3.

Import paths that moved when the package was layered (0.2): each old module
is a two-line shim calling ``moved``, which warns once and replaces itself
with the new module, so every name (public or private) of the new module
answers under the old path.

Attributes that were renamed: ``renamed_attributes`` keeps each old name of a
class as a property that warns and reads (or sets) the new one, and lets the
constructor take the old keyword.

>>> import warnings, importlib, sys
>>> _ = sys.modules.pop("radix_soa.schedule", None)
>>> with warnings.catch_warnings(record=True) as w:
...     warnings.simplefilter("always")
...     old = importlib.import_module("radix_soa.schedule")
>>> old is importlib.import_module("radix_soa.studies.schedule"), w[0].category.__name__
(True, 'DeprecationWarning')
"""

import functools
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


def renamed_attributes(renames):
    """Class decorator: ``renames`` maps old attribute names to new ones;
    each old name stays a property aliasing the new one (and a keyword of
    the constructor) that warns with a ``DeprecationWarning``.

    >>> from dataclasses import dataclass
    >>> @renamed_attributes({"size_tokens": "size_ids"})
    ... @dataclass
    ... class R:
    ...     size_ids: int
    >>> with warnings.catch_warnings(record=True) as w:
    ...     warnings.simplefilter("always")
    ...     r = R(size_tokens=3)
    ...     old = r.size_tokens
    >>> r.size_ids, old, [str(x.message)[:38] for x in w][0]
    (3, 3, 'R.size_tokens is deprecated: use R.siz')
    """
    def decorate(cls):
        def warn(old):
            warnings.warn(f"{cls.__name__}.{old} is deprecated: use {cls.__name__}.{renames[old]} "
                          f"(the old name goes in radix_soa {REMOVED_IN})", DeprecationWarning,
                          stacklevel=3)

        for old, new in renames.items():
            def get(self, _old=old, _new=new):
                warn(_old)
                return getattr(self, _new)

            def put(self, value, _old=old, _new=new):
                warn(_old)
                setattr(self, _new, value)

            setattr(cls, old, property(get, put, doc=f"Deprecated alias of ``{new}``."))
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            for old in sorted(renames.keys() & kwargs.keys()):
                warn(old)
                kwargs[renames[old]] = kwargs.pop(old)
            init(self, *args, **kwargs)

        cls.__init__ = __init__
        cls.RENAMED = dict(renames)
        return cls
    return decorate


class RenamedKeys(dict):
    """A dict in which the old keys of ``renames`` (old -> new) still read
    their new key's value, with a ``DeprecationWarning``.

    >>> d = RenamedKeys({"hit_tokens": "hit_ids"}, hit_ids=3)
    >>> with warnings.catch_warnings(record=True) as w:
    ...     warnings.simplefilter("always")
    ...     old = d["hit_tokens"]
    >>> old, list(d), str(w[0].message)[:32]
    (3, ['hit_ids'], "key 'hit_tokens' is deprecated: ")
    """

    def __init__(self, renames, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._renames = renames

    def __missing__(self, key):
        new = self._renames.get(key)
        if new is None or new not in self:
            raise KeyError(key)
        warnings.warn(f"key {key!r} is deprecated: use {new!r} (the old name goes in radix_soa "
                      f"{REMOVED_IN})", DeprecationWarning, stacklevel=2)
        return self[new]

    def get(self, key, default=None):
        return self[key] if key in self or key in self._renames else default
