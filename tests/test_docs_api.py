"""docs/guide/api.md is what ``docs/make_api.py`` writes from the
docstrings now (regenerate it with ``python docs/make_api.py``)."""

import importlib.util
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def load_generator():
    spec = importlib.util.spec_from_file_location("make_api", DOCS / "make_api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_api_reference_is_current():
    make_api = load_generator()
    assert (DOCS / "guide" / "api.md").read_text() == make_api.render(), \
        "docs/guide/api.md is out of date: run python docs/make_api.py"


def test_the_reference_names_every_public_name():
    import radix_soa as rs

    text = (DOCS / "guide" / "api.md").read_text()
    for name in rs.__all__:
        assert f"`{name}" in text, name
    assert "`PrefixCache(capacity=None, page_size=1, *, values=True" in text
