"""The package's shape: the layers of ``docs/design.md`` (imports point
down its table), kernels in modules of one job each, and the kernel options."""

import ast
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from numba import njit

import radix_soa as rs
from radix_soa._kernels import config, kernel_modules, kernel_source_hash, layout

PACKAGE = Path(rs.__file__).resolve().parent
DESIGN = PACKAGE.parent / "docs" / "design.md"


def layer_table():
    """``[(layer, [path, ...]), ...]`` bottom up, from the table under the
    "Layers" heading of docs/design.md (paths relative to the repository)."""
    text = DESIGN.read_text()
    section = text[text.index("## Layers"):]
    rows = []
    for ln in section.splitlines()[1:]:
        if ln.startswith("## "):
            break
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("layer", "") or set(cells[0]) <= {"-"}:
            continue
        rows.append((cells[0], re.findall(r"`(radix_soa/[^`]*)`", cells[1])))
    return rows


TABLE = layer_table()
LAYERS = {name: i for i, (name, _) in enumerate(TABLE)}
WHERE = sorted(((p, name) for name, paths in TABLE for p in paths), key=lambda x: -len(x[0]))


def layer_of(module):
    """The layer of ``module``: its row of the table (longest path prefix)."""
    parts = module.split(".")
    assert parts[0] == "radix_soa"
    path = MODULES[module].relative_to(PACKAGE.parent).as_posix()
    for where, name in WHERE:
        if path == where or (where.endswith("/") and path.startswith(where)):
            return name
    raise AssertionError(f"module {module} ({path}) is in no row of docs/design.md's layer table")


def package_modules():
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _type_checking_blocks(tree):
    """The ``if TYPE_CHECKING:`` blocks of a module (imports for type
    checkers only: they never run)."""
    return [node for node in ast.walk(tree) if isinstance(node, ast.If)
            and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")]


def imports_of(module, path, runtime=False):
    """Every radix_soa module ``module`` imports, anywhere in the file (a
    lazy import inside a function counts too); ``runtime``: only those that
    run (not under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    found = set()
    skipped = {id(n) for block in _type_checking_blocks(tree) for n in ast.walk(block)} \
        if runtime else set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("radix_soa"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                target = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("radix_soa"):
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                found.add(sub if sub in MODULES else target)
    return {m for m in found if m != module}


MODULES = package_modules()
GRAPH = {m: imports_of(m, p) for m, p in MODULES.items()}
#: the imports that run: a feature module of a class package imports its
#: class under ``if TYPE_CHECKING:`` only (for its ``self`` annotation), and
#: the class imports the feature module: not a cycle at run time
RUNTIME_GRAPH = {m: imports_of(m, p, runtime=True) for m, p in MODULES.items()}


def test_the_layer_table_is_read_and_names_only_paths_that_exist():
    assert [name for name, _ in TABLE] == ["kernels", "input", "tree", "events", "product",
                                           "baselines", "studies", "front ends"]
    for _, paths in TABLE:
        for p in paths:
            assert (PACKAGE.parent / p).exists(), p


def test_every_module_has_a_layer_whose_row_names_it():
    text = DESIGN.read_text()
    section = text[text.index("## Layers"):]
    rows = {ln.strip().strip("|").split("|")[0].strip(): ln for ln in section.splitlines()
            if ln.startswith("| ")}
    for m, path in MODULES.items():
        row = rows[layer_of(m)]
        stem = path.parent.name if path.name == "__init__.py" else path.stem
        assert f"`{stem}`" in row or f"`{path.relative_to(PACKAGE.parent).as_posix()}`" in row \
            or f"`{path.parent.relative_to(PACKAGE.parent).as_posix()}/`" in row, (m, row[:40])


def test_the_package_top_holds_only_the_product_and_the_front_ends():
    top = sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__")
    loose = [n for n in top if n.endswith(".py")]
    assert {layer_of(f"radix_soa.{n[:-3]}" if n != "__init__.py" else "radix_soa")
            for n in loose} <= {"product", "front ends"}
    assert len(top) <= 20, top  # was 35 before the layers became folders


def test_imports_point_down_the_layers():
    upward = [(m, dep) for m, deps in GRAPH.items() for dep in deps
              if dep in MODULES and LAYERS[layer_of(dep)] > LAYERS[layer_of(m)]]
    assert upward == []


def test_the_product_never_imports_studies_baselines_or_the_cli():
    bad = [(m, dep) for m, deps in GRAPH.items()
           if LAYERS[layer_of(m)] <= LAYERS["product"]
           for dep in deps if dep in MODULES
           and layer_of(dep) in ("studies", "baselines", "front ends")]
    assert bad == []


def test_the_oracles_compute_without_kernels():
    oracles = [m for m in MODULES if m.startswith("radix_soa.baselines.")
               and "reference" in m.rsplit(".", 1)[1]]
    assert len(oracles) == 5
    assert [(m, d) for m in oracles for d in GRAPH[m] if d.startswith("radix_soa._kernels")] == []


def test_import_radix_soa_loads_no_study_baseline_or_front_end():
    code = ("import sys, radix_soa; print(sorted(m for m in sys.modules "
            "if m.startswith('radix_soa')))")
    loaded = eval(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 check=True).stdout)
    assert "radix_soa.prefix_cache" in loaded
    assert not [m for m in loaded if m.split(".")[1:2] and m.split(".")[1] in
                ("studies", "baselines", "dask", "cli", "integrations", "_warmup")]


def test_no_import_cycles():
    state = {}

    def visit(m, stack):
        state[m] = "open"
        for dep in RUNTIME_GRAPH.get(m, ()):
            if dep == "radix_soa" or dep not in RUNTIME_GRAPH:
                continue
            if state.get(dep) == "open":
                raise AssertionError(f"import cycle: {' -> '.join(stack + [m, dep])}")
            if dep not in state:
                visit(dep, stack + [m])
        state[m] = "done"

    for m in RUNTIME_GRAPH:
        if m not in state:
            visit(m, [])


def test_every_kernel_lives_in_the_kernel_package():
    outside = [m for m, p in MODULES.items()
               if layer_of(m) != "kernels" and ("njit" in p.read_text() or "from numba" in p.read_text())]
    assert outside == []


def kernel_list():
    """The kernel modules, bottom up, as the kernels row of the layer table
    lists them (the one list: ``one module per job (`notice`, ...)``)."""
    row = DESIGN.read_text().split("\n| kernels |", 1)[1].split("\n", 1)[0]
    listed = row[row.index("one module per job ("):]
    return re.findall(r"`(\w+)`", listed[:listed.index(")")])


def test_the_layer_table_lists_every_kernel_module_in_import_order():
    order = kernel_list()
    assert sorted(order) == kernel_modules() and len(set(order)) == len(order), order
    for name in order:
        deps = {d.split(".")[2] for d in GRAPH[f"radix_soa._kernels.{name}"]
                if d.startswith("radix_soa._kernels.")}
        later = [d for d in deps if order.index(d) >= order.index(name)]
        assert later == [], f"_kernels/{name} imports {later}, listed after it"


def test_kernel_modules_stay_small():
    sizes = {p.name: len(p.read_text().splitlines()) for p in (PACKAGE / "_kernels").glob("*.py")}
    assert sizes and max(sizes.values()) < 500, sizes


def test_layout_index_constants_match_the_tree_fields():
    for i, name in enumerate(layout.TREE_FIELDS):
        assert getattr(layout, name.upper()) == i
    assert layout.Tree._fields == layout.TREE_FIELDS
    slots = [v for k, v in vars(layout).items() if k.startswith("M_")]
    assert len(slots) == len(set(slots)) and max(slots) < layout.META_SIZE


def test_result_types_belong_to_the_product():
    for cls in (rs.Match, rs.InsertResult, rs.EvictResult, rs.CacheFullError, rs.InvariantError,
                rs.ReadOnlyTreeError, rs.TreeFormatError):
        assert cls.__module__ == "radix_soa._tree.results"
    from radix_soa.baselines import reference_prefix
    assert reference_prefix.Match is rs.Match and reference_prefix.CacheFullError is rs.CacheFullError


def test_top_level_study_names_are_the_study_modules():
    from radix_soa.studies import replay as replay_module, schedule, traces, workloads
    assert rs.traces is traces and rs.workloads is workloads and rs.schedule is schedule
    assert rs.replay is replay_module.replay and rs.sweep is replay_module.sweep


def test_kernels_fall_back_when_numba_lacks_the_private_nrt_flag():
    assert "_nrt" not in config.kernel_options(nrt_flag=False)
    assert config.kernel_options(nrt_flag=True)["_nrt"] is False
    plain = njit(**{**config.kernel_options(nrt_flag=False), "cache": False})(
        lambda a: a[0] + a[-1])
    assert plain(np.arange(5)) == 4
    assert config.HAS_NRT_FLAG == config.nrt_flag_supported()


def test_kernel_source_hash_follows_every_kernel_file(tmp_path):
    pkg = tmp_path / "_kernels"
    shutil.copytree(PACKAGE / "_kernels", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    spec = importlib.util.spec_from_file_location("copied_kernels", pkg / "__init__.py")
    copied = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copied)
    assert copied.kernel_source_hash() == kernel_source_hash()
    callee = pkg / "table.py"
    callee.write_text(callee.read_text() + "\n# a change to a callee in another file\n")
    assert copied.kernel_source_hash() != kernel_source_hash()


def test_the_suite_compiles_into_a_cache_keyed_by_the_kernel_sources():
    from numba.core import config as numba_config
    leaf = f"kernels-{kernel_source_hash()}"
    cache_dir = Path(numba_config.CACHE_DIR)
    assert cache_dir.name == leaf
    # keyed once, also in a pytest-xdist worker (which inherits the keyed
    # directory): .ci/run's benchmark step looks for the kernels the suite
    # compiled in <parent>/kernels-<hash>, one level down, not two
    assert cache_dir.parent.name != leaf


#: Writers that open the lock inline (``with self._lock:`` and the reader
#: wait), for the per-call cost; every other writer uses ``self._writing``.
INLINE_WRITERS = {("radix_cache", "insert"), ("prefix_cache/mutation", "insert"),
                  ("prefix_cache/lookup", "match"), ("prefix_cache/handles", "_lock_handle"),
                  ("prefix_cache/mutation", "evict"), ("prefix_cache/lifecycle", "begin"),
                  ("prefix_cache/lifecycle", "abort"), ("prefix_cache/lifecycle", "_transition")}


def writer_modules():
    """``name``s (paths under the package, no suffix) of the modules whose
    functions may write under a cache's lock: the product's and the tree base."""
    names = [MODULES[m].relative_to(PACKAGE).with_suffix("").as_posix() for m in MODULES
             if layer_of(m) == "product"]
    return sorted(names) + ["_tree/base"]


def test_every_writing_lock_waits_for_gil_free_readers():
    # A method that mutates under the lock must first wait for the batch
    # reads running without the GIL (radix_soa._tree.base): it opens its
    # block with ``with self._writing:``, or (the hot per-call paths only)
    # with ``with self._lock:`` whose first statement is that wait.
    reading = {"exists", "match_prefix", "match_length", "_read", "_read_released",
               "memory_report", "save", "_save", "__getstate__", "to_csr", "check_invariants",
               "evictable_tokens", "namespaces", "stats", "peek", "open_requests",
               "_check_requests", "cached_values", "to_text", "overlap", "overlap_scores",
               "overlap_batch", "blocks_of", "workers", "__contains__", "_drain_readers",
               "__enter__", "_column", "snapshot_events", "status", "degraded",
               "overlap_report", "_total_bytes", "syncing", "statuses", "export_state"}
    seen = set()
    for name in writer_modules():
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef) or fn.name in reading:
                continue
            for node in ast.walk(fn):
                if not isinstance(node, ast.With):
                    continue
                opened = ast.unparse(node.items[0].context_expr)
                if opened == "self._lock":
                    first = ast.unparse(node.body[0])
                    assert (name, fn.name) in INLINE_WRITERS, \
                        f"{name}.{fn.name} opens the lock inline: use `with self._writing:`"
                    assert first.startswith("if self._readers:"), \
                        f"{name}.{fn.name} writes under the lock without waiting for readers"
                    seen.add((name, fn.name))
    assert seen == INLINE_WRITERS


def room_retries():
    """``(module, line, fast, retry)`` of every inline fast kernel call
    followed by its ``ROOM`` retry outside the kernels::

        status, ... = kernel(args)              # the fast call
        if status == ROOM:
            status, ... = s.run(lambda: kernel(args))

    ``fast`` and ``retry`` are the two assignments (None when the statement
    before the ``if`` is no call)."""
    found = []
    for m, path in MODULES.items():
        if layer_of(m) == "kernels":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            for field in ("body", "orelse", "finalbody"):
                stmts = getattr(node, field, None)
                if not isinstance(stmts, list):
                    continue
                for i, st in enumerate(stmts):
                    if not (isinstance(st, ast.If) and isinstance(st.test, ast.Compare)
                            and isinstance(st.test.ops[0], ast.Eq)
                            and ast.unparse(st.test.comparators[0]) == "ROOM"):
                        continue
                    fast = stmts[i - 1] if i else None
                    if not (isinstance(fast, ast.Assign) and isinstance(fast.value, ast.Call)):
                        fast = None
                    found.append((m, st.lineno, fast, st.body[0]))
    return found


def test_each_room_retry_passes_the_arguments_of_its_fast_call():
    # The hot single calls run their kernel inline (a ``call(kernel, *args)``
    # helper measured 1.17-1.38x slower on 1-2 us calls) and, after ``ROOM``,
    # again through ``TreeStorage.run``: the two must be the same call.
    retries = room_retries()
    assert len(retries) >= 5, retries  # match, insert, begin, the transitions, RadixCache.insert
    for m, line, fast, retry in retries:
        where = f"{m} line {line}"
        assert fast is not None, f"{where}: no kernel call right before the ROOM test"
        assert isinstance(retry, ast.Assign) and isinstance(retry.value, ast.Call) \
            and isinstance(retry.value.func, ast.Attribute) and retry.value.func.attr == "run" \
            and isinstance(retry.value.args[0], ast.Lambda), \
            f"{where}: the retry is not `... = s.run(lambda: kernel(...))`"
        again = retry.value.args[0].body
        assert ast.dump(again) == ast.dump(fast.value), \
            f"{where}: the retry calls {ast.unparse(again)}, the fast call {ast.unparse(fast.value)}"
        assert [ast.dump(t) for t in retry.targets] == [ast.dump(t) for t in fast.targets], where


def test_the_product_raises_a_kernel_status_through_the_one_map():
    # ``_tree/status.py`` turns a kernel status into its exception: a call
    # site's ``if status ...:`` raises ``status_error(...)`` and nothing else
    # (awkward's ``_handle_error`` is the model)
    sites = []
    for m, path in MODULES.items():
        if layer_of(m) != "product":
            continue
        tests = [node for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                 and ast.unparse(node.test.left) == "status"
                 # ROOM: grow and call again; UNSURE: run with a backup; no error
                 and ast.unparse(node.test.comparators[0]).split(".")[-1] not in ("ROOM", "UNSURE")]
        inner = {id(n) for node in tests for n in ast.walk(node) if n is not node}
        for node in tests:
            if id(node) in inner:
                continue  # e.g. a closed request's own error first, inside the status test
            raises = [n for n in ast.walk(node) if isinstance(n, ast.Raise)]
            sites.append(m)
            assert raises, f"{m} line {node.lineno}: a status test that raises nothing"
            for r in raises:
                assert isinstance(r.exc, ast.Call) and ast.unparse(r.exc.func) == "status_error", \
                    f"{m} line {r.lineno}: raises {ast.unparse(r.exc)}, not status_error(...)"
    assert len(sites) >= 8, sites  # insert, lock, touch, begin, abort, transitions, batches


def test_an_internal_callee_has_no_wrappers_and_runs_from_python_through_a_trampoline():
    options = {k: v for k, v in config.kernel_options().items() if k != "cache"}
    twice = config.inner(options)(lambda a, i: a[i] * 2)
    plain = njit(**options)(lambda a, i: a[i] * 2)
    caller = njit(**options)(lambda a, i: twice(a, i) + 1)
    a = np.arange(5)
    assert caller(a, 1) == 3
    assert twice(a, 4) == plain(a, 4) == 8  # from Python: the trampoline
    assert isinstance(twice, config.inner.dispatcher_type) and len(twice.signatures) == 1

    def has_cpython_wrapper(dispatcher):
        cres = dispatcher.overloads[dispatcher.signatures[0]]
        return cres.fndesc.llvm_cpython_wrapper_name in cres.library.get_llvm_str()
    assert has_cpython_wrapper(plain) and not has_cpython_wrapper(twice)


def test_internal_callees_fall_back_to_plain_kernels_without_numbas_private_pieces():
    options = {k: v for k, v in config.kernel_options().items() if k != "cache"}
    plain = config.inner(options, supported=False)(lambda a, i: a[i] * 2)
    assert type(plain) is type(njit(lambda: 0)) and not isinstance(plain, config.inner.dispatcher_type)
    assert njit(**options)(lambda a, i: plain(a, i) + 1)(np.arange(5), 2) == 5
    assert plain(np.arange(5), 4) == 8  # its own CPython wrapper
    assert config.HAS_INNER == config.inner_supported()
    # the switch, and the whole product on plain kernels (a fresh cache: none
    # of the wrapper-less code is loaded)
    code = ("import numpy as np, radix_soa as rs; from radix_soa._kernels import config, table\n"
            "assert not config.HAS_INNER and type(table.key_hash).__name__ == 'CPUDispatcher'\n"
            "rc = rs.RadixCache(); rc.insert([1, 2, 3, 4]); rc.insert([1, 2, 9])\n"
            "print(rc.exists([1, 2, 9]), rc.exists([1, 2]), rc.match_length([1, 2, 3, 7]))")
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "RADIX_SOA_PLAIN_KERNELS": "1", "NUMBA_CACHE_DIR": cache}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "False", "3"]


def test_a_helper_compiles_once_for_literal_and_narrow_int_arguments():
    options = {k: v for k, v in config.kernel_options().items() if k != "cache"}
    add = config.inner(options, plain=True)(lambda a, k, flag: a[k] + 1 if flag else a[k] - 1)
    by_literal = njit(**options)(lambda a: add(a, 2, True) + add(a, 3, False))
    by_int32 = njit(**options)(lambda a, i: add(a, np.int32(i), True))
    a = np.arange(10, 20)
    assert by_literal(a) == 13 + 12 and by_int32(a, 4) == 15
    assert by_int32(a, np.int32(4)) == 15
    # one specialization: (array, int64, bool), the literals and the int32 widened
    assert [tuple(str(t) for t in sig[1:]) for sig in add.signatures] == [("int64", "bool")]
    plain = config.inner(options)(lambda a, k, flag: a[k] + 1 if flag else a[k] - 1)
    njit(**options)(lambda a: plain(a, 2, True) + plain(a, 3, False))(a)
    assert len(plain.signatures) == 2  # the literal twins a plain internal callee compiles


def inner_kernels():
    """``{(module, name)}`` of every kernel decorated as an internal callee."""
    out = set()
    for name in kernel_modules():
        module = importlib.import_module(f"radix_soa._kernels.{name}")
        out.update((module.__name__, k) for k, v in vars(module).items()
                   if isinstance(v, config.inner.dispatcher_type) and v.__module__ == module.__name__)
    return out


def kernels_named_from_python():
    """``{(kernel module, name)}`` that Python code names: outside the kernel
    package through an imported kernel module or an imported name, inside it
    in a function that is not a kernel."""
    used = set()
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        if module.startswith("radix_soa._kernels."):
            plain = [f for f in tree.body if isinstance(f, ast.FunctionDef) and not f.decorator_list]
            used.update((module, n.id) for f in plain for n in ast.walk(f)
                        if isinstance(n, ast.Name))
            continue
        is_pkg = path.name == "__init__.py"
        base = module.split(".") if is_pkg else module.split(".")[:-1]
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = (".".join(base[: len(base) - node.level + 1]
                                   + ([node.module] if node.module else []))
                          if node.level else node.module or "")
                for a in node.names:
                    if target == "radix_soa._kernels":
                        aliases[a.asname or a.name] = f"{target}.{a.name}"
                    elif target.startswith("radix_soa._kernels."):
                        used.add((target, a.name))
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("radix_soa._kernels.") and a.asname:
                        aliases[a.asname] = a.name
        used.update((aliases[n.value.id], n.attr) for n in ast.walk(tree)
                    if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                    and n.value.id in aliases)
    return used


def test_no_internal_callee_is_called_from_the_products_python():
    # a call from Python would work (the trampoline) but compile a second
    # time and cost a trampoline per call: such a kernel takes ``kernel``
    inner = inner_kernels()
    assert len(inner) > 100
    assert inner & kernels_named_from_python() == set()
    assert ("radix_soa._kernels.descent", "match1_at") in kernels_named_from_python()
