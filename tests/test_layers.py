"""The package's shape: layers whose imports point down, kernels in modules
of one job each, the deprecated import paths, and the kernel options."""

import ast
import importlib
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from numba import njit

import radix_soa as rs
from radix_soa import _deprecated
from radix_soa._kernels import config, kernel_source_hash, layout

PACKAGE = Path(rs.__file__).resolve().parent

# Layers bottom up; a module may import only its own layer or lower ones.
# The deprecated shims are left out (they only forward to the new modules).
LAYERS = {
    "kernels": 0,       # radix_soa._kernels.*
    "results": 1,       # _results, _validate, _typing
    "storage": 2,       # _storage
    "input": 3,         # _sequence, _arrow, batch, _dedup
    "product": 4,       # the caches, persistence, invariants
    "baselines": 5,     # radix_soa.baselines.*
    "studies": 6,       # radix_soa.studies.*
    "front": 7,         # cli, _warmup, the package itself
}
PRODUCT = {"radix_cache", "prefix_cache", "_serving", "_persist", "_invariants", "_base",
           "_event_log", "router_index"}


def layer_of(module):
    parts = module.split(".")
    assert parts[0] == "radix_soa"
    if len(parts) == 1:
        return "front"
    head = parts[1]
    if head == "_kernels":
        return "kernels"
    if head in ("baselines", "studies"):
        return head
    if head in ("_results", "_validate", "_typing", "_kv_events", "_block_hash"):
        return "results"
    if head == "_storage":
        return "storage"
    if head in ("_sequence", "_arrow", "batch", "_dedup"):
        return "input"
    if head in PRODUCT:
        return "product"
    if head in ("cli", "_warmup", "dask"):
        return "front"
    raise AssertionError(f"module {module} has no layer: add it to tests/test_layers.py")


def package_modules():
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        if name in _deprecated.MOVES or name == "radix_soa._deprecated":
            continue
        out[name] = path
    return out


def imports_of(module, path):
    """Every radix_soa module ``module`` imports, anywhere in the file (a
    lazy import inside a function counts too)."""
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
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


def test_every_module_has_a_layer():
    for m in MODULES:
        layer_of(m)


def test_imports_point_down_the_layers():
    upward = [(m, dep) for m, deps in GRAPH.items() for dep in deps
              if dep in MODULES and LAYERS[layer_of(dep)] > LAYERS[layer_of(m)]]
    assert upward == []


def test_the_product_never_imports_studies_baselines_or_the_cli():
    bad = [(m, dep) for m, deps in GRAPH.items() if layer_of(m) in ("product", "input", "storage")
           for dep in deps if layer_of(dep) in ("studies", "baselines", "front")]
    assert bad == []


def test_no_import_cycles():
    state = {}

    def visit(m, stack):
        state[m] = "open"
        for dep in GRAPH.get(m, ()):
            if dep == "radix_soa" or dep not in GRAPH:
                continue
            if state.get(dep) == "open":
                raise AssertionError(f"import cycle: {' -> '.join(stack + [m, dep])}")
            if dep not in state:
                visit(dep, stack + [m])
        state[m] = "done"

    for m in GRAPH:
        if m not in state:
            visit(m, [])


def test_every_kernel_lives_in_the_kernel_package():
    outside = [m for m, p in MODULES.items()
               if layer_of(m) != "kernels" and ("njit" in p.read_text() or "from numba" in p.read_text())]
    assert outside == []


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
        assert cls.__module__ == "radix_soa._results"
    from radix_soa.baselines import reference_prefix
    assert reference_prefix.Match is rs.Match and reference_prefix.CacheFullError is rs.CacheFullError


def test_top_level_study_names_are_the_study_modules():
    from radix_soa.studies import replay as replay_module, schedule, traces, workloads
    assert rs.traces is traces and rs.workloads is workloads and rs.schedule is schedule
    assert rs.replay is replay_module.replay and rs.sweep is replay_module.sweep


@pytest.mark.parametrize("old", sorted(_deprecated.MOVES))
def test_old_import_paths_warn_and_alias_the_new_module(old, monkeypatch):
    new = importlib.import_module(_deprecated.MOVES[old])
    monkeypatch.delitem(sys.modules, old, raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mod = importlib.import_module(old)
    assert mod is new
    messages = [str(w.message) for w in caught if w.category is DeprecationWarning]
    assert len(messages) == 1 and _deprecated.MOVES[old] in messages[0] and "0.3" in messages[0]
    # the warning points at the importing code, not at importlib or the shim
    frames = [w.filename for w in caught if w.category is DeprecationWarning]
    assert "importlib" not in frames[0] and "_deprecated" not in frames[0]


def test_from_import_of_an_old_path_gives_every_name(monkeypatch):
    monkeypatch.delitem(sys.modules, "radix_soa.reference_prefix", raising=False)
    with pytest.warns(DeprecationWarning, match="radix_soa.baselines.reference_prefix"):
        from radix_soa.reference_prefix import ReferencePrefixCache, _Node  # noqa: F401
    assert ReferencePrefixCache.__module__ == "radix_soa.baselines.reference_prefix"


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


def test_every_writing_lock_waits_for_gil_free_readers():
    # A method that mutates under the lock must first wait for the batch
    # reads running without the GIL (radix_soa._base): the first statement
    # under ``with self._lock:`` of every such method is that wait.
    reading = {"exists", "match_prefix", "match_length", "_read", "_read_released",
               "memory_report", "save", "_save", "__getstate__", "to_csr", "check_invariants",
               "evictable_tokens", "namespaces", "stats"}
    for name in ("radix_cache", "prefix_cache", "_base"):
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef) or fn.name in reading:
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.With) and ast.unparse(node.items[0].context_expr) == \
                        "self._lock":
                    first = ast.unparse(node.body[0])
                    assert first.startswith("if self._readers:"), \
                        f"{name}.{fn.name} writes under the lock without waiting for readers"
