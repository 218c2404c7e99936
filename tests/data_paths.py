"""Where the tests find the real traces: the directory named by the
environment variable ``RADIX_SOA_TRACES`` (laid out as the shared data is:
``mooncake-fast25/``, ``kv-cache-tester-claude-code/``), else
``../shared/data/traces`` beside the checkout. The docs' examples and the
notebooks read the same variable with the same default."""

import os
from pathlib import Path

ENV = "RADIX_SOA_TRACES"
DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"


def traces_dir(environ=os.environ):
    """``$RADIX_SOA_TRACES`` as a path, or the default beside the checkout."""
    return Path(environ[ENV]).expanduser() if environ.get(ENV) else DEFAULT


TRACES = traces_dir()
