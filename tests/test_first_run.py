"""The first run says what it is doing: one line on a terminal before the
first kernel compiles, nothing when the kernels come from Numba's cache or
stderr is not a terminal; ``radix-soa warmup`` compiles them all."""

import os
import pty
import subprocess
import sys

import pytest

from radix_soa._kernels import notice

CODE = "import radix_soa as rs; rc = rs.RadixCache(); rc.insert([1, 2]); print(rc.exists([1, 2]))"


def run_on_a_terminal(env, code=CODE):
    """Run ``code`` in a fresh interpreter whose stderr is a pseudo-terminal;
    returns (stdout, what the terminal showed)."""
    main, child = pty.openpty()
    try:
        proc = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=child, env=env, timeout=300, text=True)
    finally:
        os.close(child)
    shown = b""
    os.set_blocking(main, False)
    try:
        while True:
            chunk = os.read(main, 65536)
            if not chunk:
                break
            shown += chunk
    except (BlockingIOError, OSError):
        pass
    os.close(main)
    assert proc.returncode == 0
    return proc.stdout, shown.decode(errors="replace")


@pytest.mark.slow
def test_one_line_on_a_terminal_before_a_cold_compile_and_none_from_the_cache(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("RADIX_SOA_QUIET", None)
    out, shown = run_on_a_terminal(env)
    assert out.strip() == "True"
    assert shown.count("compiling kernels, once") == 1
    out, shown = run_on_a_terminal(env)  # the kernels now load from the cache
    assert out.strip() == "True" and "compiling" not in shown
    # not on a terminal, or asked to be quiet: nothing, even compiling cold
    cold = {**env, "NUMBA_CACHE_DIR": str(tmp_path / "cold")}
    piped = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                           env=cold, timeout=300)
    assert piped.stdout.strip() == "True" and "compiling" not in piped.stderr
    _, shown = run_on_a_terminal({**cold, "NUMBA_CACHE_DIR": str(tmp_path / "quiet"),
                                  "RADIX_SOA_QUIET": "1"})
    assert "compiling" not in shown


def test_the_notice_needs_numbas_event_api():
    import types

    class Recorder:
        def __init__(self):
            self.kinds = []

        def register(self, kind, listener):
            self.kinds.append(kind)

        class Listener:
            pass

    events = Recorder()
    assert notice.install(event_module=events) is True and events.kinds == ["numba:compile"]
    assert notice.install(event_module=types.SimpleNamespace(register=None)) is False

    class Refusing(Recorder):
        def register(self, kind, listener):
            raise ValueError(kind)

    assert notice.install(event_module=Refusing()) is False


def test_the_notice_speaks_for_radix_soa_kernels_only():
    import io
    from types import SimpleNamespace

    registered = []
    events = SimpleNamespace(register=lambda kind, listener: registered.append(listener),
                             Listener=object)
    out = io.StringIO()
    assert notice.install(stream=out, event_module=events)
    (listener,) = registered

    def start(module):
        func = SimpleNamespace(__module__=module)
        listener.on_start(SimpleNamespace(data={"dispatcher": SimpleNamespace(py_func=func)}))

    start("numba.np.arraymath")
    assert out.getvalue() == ""
    start("radix_soa._kernels.descent")
    start("radix_soa._kernels.table")
    assert out.getvalue() == notice.MESSAGE + "\n"
