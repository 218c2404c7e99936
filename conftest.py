"""Test-session setup that must run before Numba is imported.

Numba's on-disk cache does not notice a change in a kernel's callee defined
in another file, so the suite compiles into a cache directory named by a
hash of every kernel module's source: an edited kernel package always gets a
fresh cache, and a stale kernel is never tested. ``NUMBA_CACHE_DIR``, when
set, is the parent of that directory.
"""

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parent


def _kernel_hash():
    # radix_soa/_kernels/__init__.py imports nothing heavy: load it alone,
    # without importing radix_soa (which would import Numba first)
    spec = importlib.util.spec_from_file_location(
        "_radix_soa_kernel_hash", _ROOT / "radix_soa" / "_kernels" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.kernel_source_hash()


if "numba" in sys.modules:
    raise RuntimeError("numba was imported before conftest.py could key its cache directory "
                       "by the kernel sources; do not import radix_soa from a plugin")
_leaf = f"kernels-{_kernel_hash()}"
_given = os.environ.get("NUMBA_CACHE_DIR")
# pytest-xdist's workers inherit the controller's already-keyed directory:
# key it once, or the workers compile into a nested copy no other process finds
if not (_given and os.path.basename(os.path.normpath(_given)) == _leaf):
    _parent = _given or os.path.join(tempfile.gettempdir(), "radix_soa-numba-cache")
    os.environ["NUMBA_CACHE_DIR"] = os.path.join(_parent, _leaf)

# the deprecated import shims warn on import: they are tested on purpose in
# tests/test_layers.py, not collected as doctest modules
collect_ignore = [str(_ROOT / "radix_soa" / (name + ".py")) for name in (
    "reference", "reference_prefix", "replay_reference", "simulate", "traces", "workloads",
    "schedule", "footprint")]


def _log_compiles(path):
    """Append a JSON line per Numba compile of this process to ``path``
    (``RADIX_SOA_COMPILE_LOG``: which kernels a test session compiles, in
    which worker, and their CPU seconds, their callees' excluded)."""
    import atexit
    import json
    import time

    from numba.core import event

    worker = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    lines, stack = [], []

    class Compiles(event.Listener):
        def on_start(self, ev):
            stack.append([time.process_time(), 0.0])

        def on_end(self, ev):
            t0, nested = stack.pop()
            dt = time.process_time() - t0
            if stack:
                stack[-1][1] += dt
            func = ev.data["dispatcher"].py_func
            lines.append(json.dumps({"worker": worker, "kernel": f"{func.__module__}.{func.__qualname__}",
                                     "args": str(ev.data["args"]), "seconds": dt - nested}))

    def flush():
        with open(path, "a") as f:
            f.write("".join(line + "\n" for line in lines))

    event.register("numba:compile", Compiles())
    atexit.register(flush)


@pytest.hookimpl(trylast=True)  # after the terminal reporter is there to say what it does
def pytest_configure(config):
    if os.environ.get("RADIX_SOA_COMPILE_LOG"):
        _log_compiles(os.environ["RADIX_SOA_COMPILE_LOG"])
    _warm_before_workers(config)


def _warm_before_workers(config):
    """In the controller of a pytest-xdist run only: compile every kernel
    group once (``radix-soa warmup --jobs N``, N the number of workers) into
    the keyed cache before the workers start, so each kernel compiles once,
    not once per worker. Done once per kernel source (a ``warm`` mark in the
    cache directory); ``RADIX_SOA_TEST_WARMUP=0`` turns it off."""
    if hasattr(config, "workerinput"):  # a worker: its controller warmed the cache
        return
    workers = getattr(config.option, "numprocesses", None)  # xdist's -n (0: no workers)
    if not isinstance(workers, int) or workers < 1 or getattr(config.option, "collectonly", False):
        return
    if os.environ.get("RADIX_SOA_TEST_WARMUP", "1") == "0":
        return
    mark = Path(os.environ["NUMBA_CACHE_DIR"]) / "warm"
    if mark.exists():
        return
    import subprocess
    import time

    reporter = config.pluginmanager.get_plugin("terminalreporter")
    say = reporter.write_line if reporter is not None else (lambda line: None)
    jobs = max(1, min(workers, os.cpu_count() or 1))
    say(f"radix_soa: compiling the kernels once for the {workers} workers "
        f"(radix-soa warmup --jobs {jobs}) ...")
    t0 = time.perf_counter()
    env = dict(os.environ, RADIX_SOA_QUIET="1",
               PYTHONPATH=os.pathsep.join([str(_ROOT)] + [
                   p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    done = subprocess.run([sys.executable, "-m", "radix_soa", "warmup", "--jobs", str(jobs)],
                          cwd=_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    if done.returncode != 0:  # the tests will say what is wrong; compile as they go
        say(f"radix_soa: warmup failed (exit {done.returncode}); the workers compile as they go:\n"
            + done.stdout[-2000:])
        return
    mark.parent.mkdir(parents=True, exist_ok=True)
    mark.touch()
    say(f"radix_soa: kernels compiled in {time.perf_counter() - t0:.0f} s")
