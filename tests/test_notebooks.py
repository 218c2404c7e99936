"""The notebooks ship executed: each is run again and its outputs compared
with the stored ones (``notebooks/execute.py`` says what must match: the
text of every cell, durations masked, and every number of a cell tagged
``timing``; the numbers of a cell tagged ``approx`` within 1%; the kinds of
figures).

Each notebook is its own test id; the files in the repository are never
rewritten here (``python notebooks/execute.py`` does that).

    python -m pytest tests/test_notebooks.py          # all notebooks
    python -m pytest -m "not notebook"                # skip them
"""

import importlib.util
import re
from pathlib import Path

import pytest

import data_paths

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb")) if NOTEBOOK_DIR.is_dir() else []
# the traces the notebooks' stored outputs were made with: ../shared/data/traces beside
# the checkout, or a copy named by $RADIX_SOA_TRACES (which the notebooks read too)
SHARED_DATA = data_paths.TRACES
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # colour codes in the kernel's tracebacks


def runner():
    spec = importlib.util.spec_from_file_location("execute_notebooks", NOTEBOOK_DIR / "execute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.notebook
def test_notebook_dir_holds_executed_notebooks():
    nbformat = pytest.importorskip("nbformat")
    assert NOTEBOOKS, f"{NOTEBOOK_DIR} holds no *.ipynb notebooks"
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert code and all(c.get("execution_count") is not None for c in code) \
            and any(c.get("outputs") for c in code), \
            f"{path.name} is stored unexecuted: run python notebooks/execute.py"


def test_the_notebooks_read_the_traces_where_radix_soa_traces_says():
    nbformat = pytest.importorskip("nbformat")
    reading = 0
    for path in NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code" and "shared/data" in cell.source:
                reading += 1
                assert 'os.environ.get("RADIX_SOA_TRACES", "../../shared/data/traces")' in \
                    cell.source, f"{path.name} reads the traces at a fixed path"
    assert reading >= 5


def test_the_comparison_masks_what_varies_and_nothing_else():
    ex = runner()
    cell = {"outputs": [{"output_type": "stream", "text": "built in 1.25 s; hit rate 0.8143, 35 ms"}]}
    timing = {"metadata": {"tags": ["timing"]}, "outputs": cell["outputs"]}
    other = {"outputs": [{"output_type": "stream", "text": "built in 9.5 s; hit rate 0.8143, 7 ms"}]}
    changed = {"outputs": [{"output_type": "stream", "text": "built in 1.25 s; hit rate 0.8144, 35 ms"}]}
    assert ex.comparable(cell) == ex.comparable(other) != ex.comparable(changed)
    assert ex.comparable(timing) == [("stream", (), "built in # s; hit rate #, # ms")]
    padded = {"metadata": timing["metadata"],
              "outputs": [{"output_type": "stream", "text": "built in  10.25 s; hit rate 0.8, 5 ms"}]}
    assert ex.comparable(padded) == ex.comparable(timing)
    warned = [{"outputs": [{"output_type": "stream", "text": f"{venv}/lib/python3.11/site-packages/"
                                                              "distributed/client.py:3429: UserWarning"}]}
              for venv in ("/tmp/venv", "/tmp/radix-soa-ci-venv")]
    assert ex.comparable(warned[0]) == ex.comparable(warned[1])
    # the kernel may send printed text in any number of pieces
    pieces = {"outputs": [{"output_type": "stream", "name": "stdout", "text": "built in 1.25 s; "},
                          {"output_type": "stream", "name": "stdout", "text": "hit rate 0.8143, 35 ms"}]}
    other_stream = {"outputs": [dict(pieces["outputs"][0]),
                                {**pieces["outputs"][1], "name": "stderr"}]}
    whole = {"outputs": [{**cell["outputs"][0], "name": "stdout"}]}
    assert ex.comparable(pieces) == ex.comparable(whole) != ex.comparable(other_stream)


def _stream(text, tags=()):
    return {"metadata": {"tags": list(tags)}, "outputs": [{"output_type": "stream", "text": text}]}


def test_an_approx_cell_agrees_within_one_percent_or_its_last_digit():
    ex = runner()
    stored = _stream("py tree  39791.30 B/node, 4.97x fewer, 5.2x, in 3.1 s", ["approx"])
    assert ex.same(stored, _stream("py tree 39791.24 B/node, 4.96x fewer, 5.1x, in 9 s", ["approx"]))
    # a number 2% off, a digit more or less, a word changed: not the same
    assert not ex.same(stored, _stream("py tree 39791.30 B/node, 4.87x fewer, 5.2x, in 3.1 s", ["approx"]))
    assert not ex.same(stored, _stream("py tree 39791.30 B/node, 4.97x fewer, 5.2x, 1x, in 3.1 s", ["approx"]))
    assert not ex.same(stored, _stream("py set 39791.30 B/node, 4.97x fewer, 5.2x, in 3.1 s", ["approx"]))
    # the last digit's unit: 5.2 and 5.0 differ by two
    assert not ex.same(stored, _stream("py tree 39791.30 B/node, 4.97x fewer, 5.0x, in 3.1 s", ["approx"]))
    # an untagged cell still wants every number but durations exactly
    exact = _stream("py tree 39791.30 B/node, in 3.1 s")
    assert ex.same(exact, _stream("py tree 39791.30 B/node, in 7 s"))
    assert not ex.same(exact, _stream("py tree 39791.24 B/node, in 3.1 s"))


@pytest.mark.slow
@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_and_gives_its_stored_outputs(path):
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    from nbclient.exceptions import CellExecutionError

    ex = runner()
    try:
        fresh = ex.execute(path)
    except CellExecutionError as exc:
        # str(exc) holds the failing cell's source and its traceback.
        pytest.fail(f"{path.name}: a cell raised\n{_ANSI.sub('', str(exc))}", pytrace=False)
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{path.name} ran without an error; its stored outputs were made with "
                    f"{SHARED_DATA}, absent here, so they are not compared")
    diff = ex.differences(nbformat.read(path, as_version=4), fresh)
    assert not diff, f"{path.name} gives other outputs than it stores:\n" + "\n".join(diff)
