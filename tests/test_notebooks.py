"""Execute every ``notebooks/*.ipynb`` and fail with the failing cell's error.

Each notebook is its own test id. The notebooks run in memory (the files in
the repository are never rewritten) with the ``python3`` kernel, the
notebooks directory as working directory, a 600 s timeout per cell and
``MPLBACKEND=Agg`` so matplotlib never needs a display.

    python -m pytest tests/test_notebooks.py          # all notebooks
    python -m pytest -m "not notebook"                # skip them
"""

import re
from pathlib import Path

import pytest

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb")) if NOTEBOOK_DIR.is_dir() else []
CELL_TIMEOUT = 600  # seconds per cell
KERNEL = "python3"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # colour codes in the kernel's tracebacks


@pytest.mark.notebook
def test_notebook_dir_holds_notebooks():
    assert NOTEBOOK_DIR.is_dir(), f"{NOTEBOOK_DIR} does not exist"
    assert NOTEBOOKS, f"{NOTEBOOK_DIR} holds no *.ipynb notebooks"


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    from nbclient.exceptions import CellExecutionError

    # The kernel subprocess inherits this process's environment.
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT,
        kernel_name=KERNEL,
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
    )
    try:
        client.execute()
    except CellExecutionError as exc:
        # str(exc) holds the failing cell's source and its traceback.
        pytest.fail(f"{path.name}: a cell raised\n{_ANSI.sub('', str(exc))}", pytrace=False)
