"""The command line on arbitrary flags and trace lines: exit 0 or 2, and on
2 exactly one line, never a traceback."""

import gzip
import json

from hypothesis import HealthCheck, given, settings, strategies as st

from radix_soa.cli import main

NUMBERS = st.one_of(st.integers(-5, 50), st.integers(10**15, 10**25).map(str),
                    st.sampled_from(["x", "1.5", "", "0x10", "1e30", "-0", "40GB", "1.5k",
                                     "160KiB", "2Pi", "9" * 30 + "P", "0.5", "nan", "-1k",
                                     "1.0001k", "GB"]))
FLAGS = st.lists(st.tuples(st.sampled_from(["--points", "--window", "--page-size",
                                            "--host-capacity", "--capacities", "--requests",
                                            "--seed", "--kv-bytes-per-token", "--warmup",
                                            "--capacity-unit", "--workers"]), NUMBERS),
                 max_size=3)
SWITCHES = st.lists(st.sampled_from(["--csv", "--json", "--capacity-unit=tokens",
                                     "--capacity-unit=bytes", "--capacity-unit=ids"]),
                    max_size=2)
VALUES = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=True), st.text(max_size=5),
                   st.just(10**400), st.lists(st.integers(-3, 2**64), max_size=4), st.none())
LINE = st.one_of(
    st.fixed_dictionaries({"timestamp": VALUES, "input_length": VALUES,
                           "output_length": VALUES, "hash_ids": VALUES}).map(json.dumps),
    st.fixed_dictionaries({"tokens": VALUES, "timestamp": VALUES}).map(json.dumps),
    st.text(max_size=30),
    st.just("[" * 100_000 + "]" * 100_000),
    st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
)


def run(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code in (0, 2), (argv, code, err)
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err, (argv, err)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(FLAGS, SWITCHES)
def test_study_flags(capsys, flags, switches):
    argv = ["study", "--no-progress", "--requests", "20", *switches]
    for flag, value in flags:
        argv += [flag, str(value) if flag != "--capacities" else f"3,{value}"]
    run(argv, capsys)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                HealthCheck.too_slow])
@given(st.lists(LINE, min_size=1, max_size=4),
       st.sampled_from(["mooncake", "tokens", "kvcache-tester", None]),
       st.sampled_from(["utf-8", "utf-16", "gzip", "gzip-cut"]))
def test_trace_lines(capsys, tmp_path_factory, lines, fmt, encoding):
    path = tmp_path_factory.mktemp("t") / "trace.jsonl"
    text = "\n".join(lines) + "\n"
    if encoding == "utf-16":
        path.write_bytes(text.encode("utf-16"))
    elif encoding.startswith("gzip"):
        data = gzip.compress(text.encode("utf-8", errors="surrogatepass"))
        path.write_bytes(data[:-6] if encoding == "gzip-cut" else data)
    else:
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
    argv = ["study", "--no-progress", "--points", "2", "--trace", str(path)]
    run(argv + ([] if fmt is None else ["--format", fmt]), capsys)
