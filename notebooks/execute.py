"""Execute the notebooks and store their outputs, or check stored outputs
against a fresh execution.

    python notebooks/execute.py                 # run every notebook, write its outputs in place
    python notebooks/execute.py hit_rate_study  # one notebook
    python notebooks/execute.py --check         # run each in memory, compare with what is stored

Needs the dev extra (nbclient, nbformat, ipykernel, matplotlib). Each
notebook runs with the ``python3`` kernel, the notebooks directory as
working directory, ``MPLBACKEND=Agg`` and 600 s per cell.

What "the same outputs" means (``comparable``): the same cells print the
same text and show the same kinds of figures, once what varies from run to
run is masked: durations (``1.2 s``, ``35 ms``), rates and speed ratios in
cells tagged ``timing`` (every number there), and the bytes of images.
Cells tagged ``approx`` hold numbers measured with tracemalloc (the bytes of
Python objects, which move by a few bytes between runs): their numbers must
agree within 1% or one unit of the last digit printed, whichever is larger.
Counts, hit rates, byte counts and every other number of an untagged cell
must match exactly.
"""

import os
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CELL_TIMEOUT = 600
KERNEL = "python3"
TIMING_TAG = "timing"
APPROX_TAG = "approx"
APPROX_RELATIVE = 0.01

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DURATION = re.compile(r"\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?\s*(?:µs|us|ns|ms|s|min|seconds?)\b")
_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")


def notebooks(names=()):
    found = sorted(HERE.glob("*.ipynb"))
    if names:
        wanted = {n if n.endswith(".ipynb") else f"{n}.ipynb" for n in names}
        found = [p for p in found if p.name in wanted]
        missing = wanted - {p.name for p in found}
        if missing:
            raise SystemExit(f"no notebook {sorted(missing)[0]} in {HERE}")
    return found


def execute(path):
    """The notebook at ``path`` executed (in memory), as an nbformat node."""
    import nbclient
    import nbformat

    os.environ["MPLBACKEND"] = "Agg"  # the kernel inherits it
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name=KERNEL,
                                     resources={"metadata": {"path": str(HERE)}})
    client.execute()
    return nb


def _text(output):
    if output.get("output_type") == "stream":
        return output.get("text", "")
    data = output.get("data", {})
    return data.get("text/plain", "") if "image/png" not in data else ""


def _joined_streams(outputs):
    """The outputs with each run of one stream's pieces joined: how a
    kernel splits printed text into messages depends on its timing."""
    joined = []
    for o in outputs:
        if (o.get("output_type") == "stream" and joined
                and joined[-1].get("output_type") == "stream" and joined[-1].get("name") == o.get("name")):
            joined[-1] = {**joined[-1], "text": _text(joined[-1]) + _text(o)}
        else:
            joined.append(o)
    return joined


def _tags(cell):
    return cell.get("metadata", {}).get("tags", [])


def comparable(cell):
    """What must match exactly between two executions of a code cell: its
    outputs' kinds and their text, with run-to-run variation masked (the
    numbers of an ``approx`` cell too: ``approx_numbers`` gives those)."""
    tags = _tags(cell)
    masked = TIMING_TAG in tags or APPROX_TAG in tags
    out = []
    for o in _joined_streams(cell.get("outputs", [])):
        kind = o.get("output_type")
        if kind == "error":
            out.append(("error", o.get("ename")))
            continue
        data = o.get("data", {})
        mimes = tuple(sorted(m for m in data if m != "text/plain")) if data else ()
        text = _ANSI.sub("", _text(o))
        text = re.sub(r"<Figure size [^>]*>", "<Figure>", text)
        text = re.sub(r" at 0x[0-9a-f]+", " at 0x…", text)
        text = re.sub(r"\S*/site-packages/", ".../site-packages/", text)  # the venv's path
        text = (_NUMBER if masked else _DURATION).sub("#", text)
        if masked:  # a column padded to its number's width
            text = re.sub(r"[ \t]+", " ", text)
        out.append((kind if kind != "execute_result" else "display_data", mimes, text))
    return out


def approx_numbers(cell):
    """The numbers an ``approx`` cell prints, in order, as strings (durations
    left out); none for any other cell."""
    if APPROX_TAG not in _tags(cell) or TIMING_TAG in _tags(cell):
        return []
    text = "".join(_ANSI.sub("", _text(o)) for o in cell.get("outputs", []))
    return _NUMBER.findall(_DURATION.sub("#", text))


def _close(a, b):
    """``a`` and ``b`` (printed numbers) agree within ``APPROX_RELATIVE`` or
    one unit of the last digit the coarser of them prints."""
    x, y = float(a.replace(",", "")), float(b.replace(",", ""))
    decimals = min(0 if "e" in n.lower() else len(n.partition(".")[2]) for n in (a, b))
    unit = 10.0 ** -decimals * (1 + 1e-9)  # the slack absorbs binary rounding of the difference
    return abs(x - y) <= max(APPROX_RELATIVE * max(abs(x), abs(y)), unit)


def same(stored, fresh):
    """Whether two executions of a code cell give the same outputs."""
    if comparable(stored) != comparable(fresh):
        return False
    a, b = approx_numbers(stored), approx_numbers(fresh)
    return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))


def differences(stored, fresh):
    """Lines saying where ``fresh`` (an execution) differs from ``stored``."""
    a = [c for c in stored.cells if c.cell_type == "code"]
    b = [c for c in fresh.cells if c.cell_type == "code"]
    if len(a) != len(b):
        return [f"{len(a)} code cells stored, {len(b)} executed"]
    lines = []
    for i, (x, y) in enumerate(zip(a, b)):
        if x.get("execution_count") is None:
            lines.append(f"code cell {i}: stored unexecuted (run python notebooks/execute.py)")
        elif not same(x, y):
            lines.append(f"code cell {i}: stored {comparable(x)!r}\n   executed {comparable(y)!r}")
    return lines


def main(argv):
    import nbformat

    check = "--check" in argv
    names = [a for a in argv if not a.startswith("--")]
    failed = 0
    for path in notebooks(names):
        fresh = execute(path)
        if check:
            diff = differences(nbformat.read(path, as_version=4), fresh)
            for line in diff:
                print(f"{path.name}: {line}")
            failed += bool(diff)
        else:
            nbformat.write(fresh, path)
            print(f"executed {path.name}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
