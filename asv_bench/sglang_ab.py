"""The SGLang adapter of another checkout beside this one's, per call, in
one process (``sglang_side.compare_default`` with one more cache), so the
load of a shared machine falls on both alike::

    /tmp/sgl-venv/bin/python asv_bench/sglang_ab.py /work/main [repeat]

The other checkout's ``radix_soa`` is copied as ``radix_soa_a`` (in
``<tmp>/radix_soa-sglang_ab``; the package imports itself relatively) and
its ``SGLangPrefixCache`` built from the same SGLang ``CacheInitParams``.
Prints the per-call table of ``bench.py sglang`` for
``UnifiedRadixCache`` (Rust core), the other checkout's adapter
(``main``), this checkout's and a bare ``PrefixCache``, with the ratio
``main / adapter`` (> 1: this checkout is faster), and where this
adapter's time goes.
"""

import importlib
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_side  # noqa: E402

HOME = Path(tempfile.gettempdir()) / "radix_soa-sglang_ab"


def main(argv):
    if len(argv) not in (1, 2):
        print(__doc__.split("::")[1].strip().splitlines()[0], file=sys.stderr)
        return 2
    repeat = int(argv[1]) if len(argv) == 2 else 5
    shutil.rmtree(HOME / "radix_soa_a", ignore_errors=True)
    shutil.copytree(Path(argv[0]) / "radix_soa", HOME / "radix_soa_a",
                    ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, str(HOME))
    sg = sglang_side.import_default()
    if sg is None:
        print("SGLang is not importable here (docs/guide/sglang.md)", file=sys.stderr)
        return 2
    other = importlib.import_module("radix_soa_a.integrations.sglang")
    importlib.import_module("radix_soa_a").warmup()
    own = sglang_side.default_cache

    def default_cache(sg, kind, page_size=1, allocator=None, pool=None):
        if kind != "main":
            return own(sg, kind, page_size, allocator, pool)
        allocator = sglang_side._FakeAlloc() if allocator is None else allocator
        params = sg.CacheInitParams(disable=False, req_to_token_pool=pool,
                                    token_to_kv_pool_allocator=allocator, page_size=page_size,
                                    tree_components=(sg.ComponentType.FULL,))
        return other.SGLangPrefixCache(params)

    sglang_side.default_cache = default_cache
    sglang_side.DEFAULT_LABELS["main"] = f"adapter of {Path(argv[0]).name}"
    sglang_side.run_default(repeat, kinds=("unified-rust", "main", "radix_soa", "bare"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
