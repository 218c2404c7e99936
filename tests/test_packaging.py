"""The distributions carry what users and the sdist's own tests need: the
sdist holds the tests (``tests/naive.py`` and the root ``conftest.py``
included), benchmarks, docs, notebooks, CI script, LICENSE, CHANGELOG and
CONTRIBUTING; the wheel holds ``py.typed``. Builds both with ``python -m
build`` (an isolated build environment: slow)."""

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("build", reason="python -m build is not installed (pip install build)")

# one worker runs this file: its module-scoped fixture is built once
pytestmark = pytest.mark.xdist_group("packaging")


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    top = names[0].split("/")[0]
    members = {n[len(top) + 1:] for n in names if n.startswith(top + "/")}
    with zipfile.ZipFile(wheel) as z:
        wheel_members = set(z.namelist())
    return members, wheel_members


@pytest.mark.slow
def test_sdist_carries_its_tests_benchmarks_and_docs(dists):
    members, _ = dists
    for need in ("tests/naive.py", "conftest.py", "tests/conftest.py", "LICENSE",
                 "CHANGELOG.md", "CONTRIBUTING.md", "README.md", "docs/design.md",
                 "asv_bench/asv.conf.json", "asv_bench/bench.py", ".ci/run",
                 "radix_soa/py.typed"):
        assert need in members, need
    here = {str(p.relative_to(ROOT)) for d in ("tests", "asv_bench/benchmarks", "notebooks")
            for p in (ROOT / d).iterdir() if p.suffix in (".py", ".ipynb")}
    assert here and here <= members, sorted(here - members)
    assert not [m for m in members if "__pycache__" in m or m.startswith("asv_bench/env")]


@pytest.mark.slow
def test_wheel_ships_py_typed_and_license(dists):
    _, wheel = dists
    assert "radix_soa/py.typed" in wheel
    assert any(m.endswith("LICENSE") and ".dist-info/" in m for m in wheel)
    assert not any(m.startswith("tests/") for m in wheel)
