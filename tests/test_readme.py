"""The code of README.md and docs/guide/*.md, run as written.

Every ```python block runs on its own, in a fresh namespace (as a reader
pasting it into a new interpreter would), statement by statement, from a
directory laid out like a checkout (``../shared`` beside it, so relative
paths resolve; files a block writes land in a temporary directory, not in
the repository). A block preceded by the line ``<!-- needs: ../shared/data
-->`` reads the real traces: without them it is left out of the first test
(which must never depend on it) and the second test, which runs every block,
skips with the reason.

A one-line expression statement (not a ``print``) whose comment starts with
a Python literal (``rc.exists([1, 2, 3])  # False: an internal prefix``,
``len(rc)  # 3 distinct sequences``) is also checked: the expression must
equal it.

The quick start's commands are checked against ``.ci/run``: CI runs the
README's test command verbatim, so the two cannot drift apart.
"""

import ast
import re
from pathlib import Path

import pytest

import data_paths

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDE = sorted((ROOT / "docs" / "guide").glob("*.md"))
DOCS = [README] + GUIDE
SHARED = ROOT.parent / "shared"
NEEDS_DATA = "<!-- needs: ../shared/data -->"
TRACES = data_paths.TRACES  # $RADIX_SOA_TRACES, which the data blocks read too

FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)


def blocks(lang, doc=README):
    """``(line, code, needs_data)`` of every ```lang block of ``doc``:
    ``line`` is the document's line of the code's first line."""
    text = doc.read_text()
    out = []
    for m in FENCE.finditer(text):
        if m.group(1) != lang:
            continue
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        line = text.count("\n", 0, m.start(2)) + 1
        out.append((line, m.group(2), before == NEEDS_DATA))
    return out


def claim(source_line):
    """The literal a comment states the line's value to be, or ``None``."""
    code, sep, comment = source_line.partition("#")
    if not sep:
        return None
    comment = comment.strip()
    for text in (comment.split(":", 1)[0], comment.split(" ", 1)[0]):
        try:
            return (ast.literal_eval(text.strip()),)
        except (ValueError, SyntaxError):
            continue
    return None


def _is_print(node):
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "print")


def _is_main_guard(stmt):
    """``if __name__ == "__main__":`` (a block written to run as a script)."""
    t = stmt.test if isinstance(stmt, ast.If) else None
    return (t is not None and not stmt.orelse and isinstance(t, ast.Compare)
            and isinstance(t.left, ast.Name) and t.left.id == "__name__"
            and len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq)
            and isinstance(t.comparators[0], ast.Constant) and t.comparators[0].value == "__main__")


def _unguarded(body):
    """The statements of a block, a main guard's body run as the block's own
    (so its stated values are checked too)."""
    for stmt in body:
        if _is_main_guard(stmt):
            yield from stmt.body
        else:
            yield stmt


def run_block(line, code, ns, doc=README):
    """Run ``code`` statement by statement in ``ns``; error tracebacks name
    the document and its line numbers. Returns how many claims were checked."""
    source = "\n" * (line - 1) + code
    lines = source.splitlines()
    checked = 0
    for stmt in _unguarded(ast.parse(source, str(doc)).body):
        expected = None
        if (isinstance(stmt, ast.Expr) and stmt.lineno == stmt.end_lineno
                and not _is_print(stmt.value)):
            expected = claim(lines[stmt.lineno - 1])
        if expected is None:
            exec(compile(ast.Module([stmt], type_ignores=[]), str(doc), "exec"), ns)
            continue
        value = eval(compile(ast.Expression(stmt.value), str(doc), "eval"), ns)
        assert value == expected[0], (
            f"{doc.name} line {stmt.lineno}: {lines[stmt.lineno - 1].strip()!r} "
            f"gives {value!r}")
        checked += 1
    return checked


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A working directory where ``../shared`` is the real one (when present)."""
    work = tmp_path / "radix_soa"
    work.mkdir()
    if SHARED.is_dir():
        (tmp_path / "shared").symlink_to(SHARED, target_is_directory=True)
    monkeypatch.chdir(work)
    return work


def run_doc(doc, include_data):
    """Run every python block of ``doc``, each in a fresh namespace."""
    ran = checked = 0
    for line, code, needs_data in blocks("python", doc):
        if needs_data and not include_data:
            continue
        checked += run_block(line, code, {"__name__": "__doc_block__"}, doc)
        ran += 1
    return ran, checked


def test_the_docs_have_python_blocks_and_mark_the_data_ones():
    assert len(blocks("python")) >= 5 and len(GUIDE) >= 6
    needing = []
    for doc in DOCS:
        found = blocks("python", doc)
        # a block reading ../shared must say so, and only such blocks are marked
        for line, code, needs in found:
            assert needs == ("../shared/data" in code), f"{doc.name} line {line}"
        needing += [line for line, code, needs in found if needs]
    assert needing, "the studies page reads a real trace"


# a page whose blocks start a Dask cluster runs in the slow part
SLOW_DOCS = {"dask.md"}


@pytest.mark.parametrize("doc", [pytest.param(d, marks=pytest.mark.slow) if d.name in SLOW_DOCS else d
                                 for d in DOCS], ids=lambda d: d.name)
def test_every_python_block_runs_on_its_own_without_the_data(checkout, doc):
    ran, checked = run_doc(doc, include_data=False)
    assert ran == sum(1 for *_, needs in blocks("python", doc) if not needs)
    if doc is README:
        assert checked >= 10  # the README's stated values were compared


DATA_DOCS = [d for d in DOCS if any(needs for *_, needs in blocks("python", d))]


@pytest.mark.parametrize("doc", DATA_DOCS, ids=lambda d: d.name)
def test_every_python_block_runs_on_its_own_with_the_data(checkout, doc, monkeypatch):
    if not TRACES.is_dir():
        pytest.skip(f"{TRACES} is absent: the trace blocks need the real traces "
                    "(RADIX_SOA_TRACES names a copy)")
    monkeypatch.setenv(data_paths.ENV, str(TRACES.resolve()))  # the blocks run elsewhere
    ran, _ = run_doc(doc, include_data=True)
    assert ran == len(blocks("python", doc))


def test_the_data_blocks_read_the_traces_where_radix_soa_traces_says(tmp_path, monkeypatch):
    """With no ../shared beside the checkout, the data blocks read the
    directory ``RADIX_SOA_TRACES`` names (here a small trace in the shared
    data's layout)."""
    work = tmp_path / "radix_soa"
    work.mkdir()
    monkeypatch.chdir(work)
    mine = tmp_path / "my-traces" / "mooncake-fast25"
    mine.mkdir(parents=True)
    (mine / "conversation_trace.jsonl").write_text("".join(
        f'{{"timestamp": {i}, "input_length": 1024, "output_length": 1, '
        f'"hash_ids": [0, {i + 1}]}}\n' for i in range(50)))
    monkeypatch.setenv(data_paths.ENV, str(tmp_path / "my-traces"))
    doc = ROOT / "docs" / "guide" / "studies.md"
    line, code, _ = next(b for b in blocks("python", doc) if b[2])
    ns = {"__name__": "__doc_block__"}
    run_block(line, code, ns, doc)
    assert len(ns["tr"]) == 50


@pytest.mark.slow
def test_the_dask_block_runs_as_a_script(tmp_path):
    """Pasted into a file and run with ``python``: the workers are spawned
    processes, which import the script again, so the block carries its main
    guard."""
    import subprocess
    import sys

    pytest.importorskip("dask.distributed")
    doc = ROOT / "docs" / "guide" / "dask.md"
    (line, code, _), = [b for b in blocks("python", doc) if "LocalCluster(" in b[1]]
    assert any(_is_main_guard(stmt) for stmt in ast.parse(code).body)
    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow
def test_the_testing_guide_states_the_size_of_the_fast_suite():
    """docs/guide/testing.md's count of the fast tests, within 10% of what
    pytest collects (it had fallen 15% behind)."""
    import subprocess
    import sys

    guide = (ROOT / "docs" / "guide" / "testing.md").read_text()
    stated = re.search(r"about ([\d,]+) tests", guide)
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "not slow", "--collect-only",
                           "-q", "-n", "0"], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    counts = re.findall(r"^\S+: (\d+)$", done.stdout, re.M)
    assert counts, done.stdout[-2000:] + done.stderr[-2000:]
    collected = sum(map(int, counts))
    assert abs(int(stated.group(1).replace(",", "")) - collected) <= 0.1 * collected, collected


def test_a_main_guard_is_run_and_its_values_checked():
    code = 'import math\nif __name__ == "__main__":\n    x = 2\n    x + 1  # 3\n'
    ns = {"__name__": "__doc_block__"}
    assert run_block(1, code, ns) == 1 and ns["x"] == 2
    with pytest.raises(AssertionError, match="gives 3"):
        run_block(1, code.replace("# 3", "# 4"), {"__name__": "__doc_block__"})


def quick_start():
    text = README.read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [m.group(2).strip() for m in FENCE.finditer(section) if m.group(1) == "bash"]


def ci_commands():
    return [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()
            if ln.strip() and not ln.lstrip().startswith("#")]


def test_quick_start_is_two_commands_that_ci_runs():
    install_and_study, install_and_test = quick_start()
    for cmd in (install_and_study, install_and_test):
        assert "\n" not in cmd
    ci = ci_commands()
    # the README's test command is run by CI verbatim ...
    assert install_and_test in ci
    # ... and CI installs what the first command installs and runs its job
    install, study = (part.strip() for part in install_and_study.split("&&"))
    assert install == "pip install -e ."
    assert any(c.startswith(study) for c in ci), study


def test_readme_links_only_in_repository_docs():
    text = README.read_text()
    assert "docs/design.md" in text
    for target in re.findall(r"\]\(([^)]+)\)", text):
        assert not target.startswith(".."), target
        if "://" not in target:
            assert (ROOT / target.split("#")[0]).exists(), target
    assert "DESIGN.md" not in text


def test_claims_parser():
    assert claim("rc.exists([1])  # False: an internal prefix") == (False,)
    assert claim("len(rc)  # 3 distinct sequences") == (3,)
    assert claim("rc.num_nodes, rc.num_tokens  # (2, 5): nodes") == ((2, 5),)
    assert claim("pc.stats  # lookups, query tokens") is None
    assert claim("x = 1") is None
