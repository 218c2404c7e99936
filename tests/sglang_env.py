"""SGLang for the tests that run against it: skip (with the reason) where
it is not installed, and import it where it is.

SGLang is not a dependency of the test suite: CI installs it in a leg of
its own (``.ci/run``, the recipe in ``docs/guide/sglang.md``) and runs
``tests/test_sglang_adapter.py`` there. On a machine without torchvision
(it is not needed: SGLang's CPU install leaves it out on purpose) two
SGLang config modules would fail to import, so a stand-in module is put in
its place first, after transformers has recorded torchvision as absent.
"""

import importlib.machinery
import importlib.util
import os
import sys
import types

import pytest

REASON = ("SGLang 0.5.23 is not installed here: the SGLang leg of .ci/run installs it "
          "(CPU torch, docs/guide/sglang.md) and runs these tests")


def require_sglang():
    """Skip the calling test module unless SGLang is installed; make it
    importable. Where ``RADIX_SOA_REQUIRE_SGLANG=1`` (the SGLang leg of
    ``.ci/run``), a missing SGLang fails instead, so the leg cannot pass by
    skipping."""
    if importlib.util.find_spec("sglang") is None:
        if os.environ.get("RADIX_SOA_REQUIRE_SGLANG") == "1":
            pytest.fail("RADIX_SOA_REQUIRE_SGLANG=1 but " + REASON, pytrace=False)
        pytest.skip(REASON, allow_module_level=True)
    prepare()


def prepare():
    """Make an installed SGLang importable (nothing to do without one)."""
    if (importlib.util.find_spec("sglang") is not None
            and importlib.util.find_spec("torchvision") is None):
        _stand_in_for_torchvision()


def _stand_in_for_torchvision():
    import transformers.utils.import_utils  # noqa: F401  (records torchvision as absent)

    class InterpolationMode:
        BICUBIC, BILINEAR, NEAREST = "bicubic", "bilinear", "nearest"

    for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.functional"):
        if name in sys.modules:
            continue
        m = types.ModuleType(name)
        m.__spec__ = importlib.machinery.ModuleSpec(name, None)
        m.__path__ = []
        if name != "torchvision":
            m.InterpolationMode = InterpolationMode
        sys.modules[name] = m
