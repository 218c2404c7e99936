"""The ``radix-soa`` command: ``study`` (in process, plus one run of the
installed entry point) and the ``build`` default."""

import csv
import gzip
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import data_paths  # $RADIX_SOA_TRACES, else ../shared/data/traces

import radix_soa
from radix_soa import workloads
from radix_soa.cli import default_capacities, main
from radix_soa.studies.study import generated_trace

TRACES = data_paths.TRACES
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# a small built-in workload for most tests
SMALL = ["--workload", "chat", "--requests", "300", "--seed", "3"]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, *argv):
    code, out, err = run(capsys, "study", "--json", *argv)
    assert code == 0, err
    return json.loads(out)


def assert_usage_error(capsys, *argv):
    with pytest.raises(SystemExit) as exc:  # argparse errors exit via SystemExit
        code = main(list(argv))
        raise SystemExit(code)
    out, err = capsys.readouterr()
    assert exc.value.code == 2
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("radix-soa: error: "), err
    assert "Traceback" not in err
    return lines[0]


def write_mooncake(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


MOONCAKE_ROWS = [
    {"timestamp": 0, "input_length": 1500, "output_length": 10, "hash_ids": [0, 1, 2]},
    {"timestamp": 5, "input_length": 2000, "output_length": 10, "hash_ids": [0, 1, 2, 3]},
    {"timestamp": 9, "input_length": 1024, "output_length": 10, "hash_ids": [0, 4]},
    {"timestamp": 12, "input_length": 2100, "output_length": 10, "hash_ids": [0, 1, 2, 3, 5]},
]


# ----------------------------------------------------------------------------
# study
# ----------------------------------------------------------------------------

def table_rows(lines):
    """(names row index, rows as lists of cells) of the printed sweep table."""
    head = next(i for i, line in enumerate(lines)
                if line.split()[:1] == ["capacity"] and "hit rate" in line)
    rows = []
    for line in lines[head + 2:]:
        if not line.strip():
            break
        rows.append(line.split())
    return head, rows


@pytest.mark.slow
def test_default_study_prints_header_table_legend_summary_and_memory(capsys):
    code, out, err = run(capsys)  # no subcommand: the study
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("workload multi_turn (multi_turn_branching, seed 0): 2,000 requests")
    assert "block size 1" in lines[0] and "1 namespace" in lines[0]
    assert lines[1].startswith("capacities in ids (= tokens); unbounded footprint ")
    head, rows = table_rows(lines)
    names, units = lines[head].split("  "), lines[head + 1]
    assert units.split() == ["(tokens)", "(tokens)", "(share)", "(tokens)", "(bytes)", "(ms)"]
    assert [n.strip() for n in names if n.strip()] == \
        ["capacity", "hit rate", "req. w/ hit", "evicted", "index peak", "replay"]
    assert len(rows) == 10
    hit_rates = [float(r[1]) for r in rows]
    assert hit_rates == sorted(hit_rates) and 0 < hit_rates[0] < hit_rates[-1] <= 1
    legend = lines[head + 13:]
    # every column is explained; what was left out (all zero or a duplicate) is said
    for name in ("capacity (tokens):", "hit rate (tokens):", "evicted (tokens):",
                 "index peak (bytes): peak memory", "replay (ms):"):
        assert any(line.strip().startswith(name) for line in legend), name
    assert "  left out: host hit (all zero), prefill saved (equal to hit rate), rejected " \
           "(all zero)" in out
    summary = next(line for line in lines if line.startswith("summary: "))
    assert "is the smallest capacity swept that reaches 90% of the unbounded hit rate" in summary
    assert "bytes per stored id" in out and "compression ratio" in out
    assert err == ""  # stderr is not a terminal under capsys: no progress bar


def test_the_summary_names_the_first_capacity_reaching_90_percent(capsys):
    doc = run_json(capsys, *SMALL, "--points", "6")
    target = 0.9 * doc["unbounded"]["hit_rate"]
    first = next(r["capacity"] for r in doc["sweep"] if r["hit_rate"] >= target)
    assert doc["summary"]["smallest_capacity"] == first
    assert all(r["hit_rate"] < target for r in doc["sweep"] if r["capacity"] < first)
    assert doc["summary"]["line"].startswith(f"summary: {first:,} tokens is the smallest")
    low = run_json(capsys, *SMALL, "--capacities", "10,20")
    assert low["summary"]["smallest_capacity"] is None
    assert "no capacity swept reaches 90%" in low["summary"]["line"]


def test_replay_time_leaves_out_compilation(capsys, monkeypatch):
    from radix_soa.cli import study as cli_study
    calls = []
    real = cli_study.warmup_replay
    monkeypatch.setattr(cli_study, "warmup_replay", lambda: calls.append(1) or real())
    run_json(capsys, *SMALL, "--points", "2")
    assert calls == [1]  # the kernels are compiled before the first timed replay


def test_json_hit_rates_equal_a_direct_sweep(capsys):
    doc = run_json(capsys, *SMALL, "--points", "4")
    seqs = workloads.generate("chat", n_sequences=300, seed=3)
    unbounded = radix_soa.replay(seqs)
    caps = default_capacities(unbounded.peak_ids, 4)
    assert doc["capacities"] == caps and doc["footprint"] == unbounded.peak_ids
    direct = radix_soa.sweep(seqs, caps)
    assert [r["hit_rate"] for r in doc["sweep"]] == [r.hit_rate for r in direct.results]
    assert [r["prefill_tokens_saved"] for r in doc["sweep"]] == \
        [r.prefill_tokens_saved for r in direct.results]
    assert doc["unbounded"]["hit_rate"] == unbounded.hit_rate
    assert doc["workload"]["requests"] == 300 and doc["workload"]["block_size"] == 1
    mem = doc["index_memory"]
    assert isinstance(mem["used_bytes"], int) and isinstance(mem["compression_ratio"], float)
    assert mem["tokens_stored"] == unbounded.peak_ids  # no eviction: the same tree
    # block counts are named as ids, real tokens as tokens
    assert doc["unbounded"]["hit_ids"] == unbounded.hit_ids
    assert doc["unbounded"]["prefill_tokens_hit"] == unbounded.prefill_tokens_hit


# what radix-soa 0.1's ``study --json`` wrote for each replay (its
# "unbounded" and every "sweep" row); the *_tokens counts were ids
def test_json_counts_ids_under_the_id_names(capsys, tmp_path):
    """``--json`` writes each replay's ``summary()``: the id counts under
    their ``*_ids`` names (blocks on a Mooncake trace), nothing else."""
    path = write_mooncake(tmp_path / "mini.jsonl", MOONCAKE_ROWS)
    doc = run_json(capsys, "--trace", str(path), "--capacities", "4,6", "--host-capacity", "3")
    for r in [doc["unbounded"], *doc["sweep"]]:
        assert list(r) == list(radix_soa.replay([[1]]).summary())
        assert not {"total_tokens", "hit_tokens", "peak_tokens"} & set(r)
    # blocks, not tokens: request 2 hits 3 blocks, request 3 one, request 4 four
    assert doc["unbounded"]["hit_ids"] == 8 and doc["unbounded"]["total_ids"] == 14
    small = doc["sweep"][0]  # capacity 4: evicts, and the host tier takes what it evicts
    assert small["evicted_ids"] > 0
    assert small["peak_ids"] <= 4
    assert "deprecated_keys" not in doc


def test_json_with_explicit_capacities_and_replay_options(capsys):
    doc = run_json(capsys, *SMALL, "--capacities", "20000,5_000,5000", "--schedule", "lpm",
                   "--window", "8", "--page-size", "4", "--host-capacity", "3000")
    assert doc["capacities"] == [5000, 20000]
    seqs = workloads.generate("chat", n_sequences=300, seed=3)
    direct = radix_soa.sweep(seqs, [5000, 20000], schedule="lpm", window=8, page_size=4,
                             host_capacity=3000)
    assert [(r["hit_rate"], r["host_hit_rate"]) for r in doc["sweep"]] == \
        [(r.hit_rate, r.host_hit_rate) for r in direct.results]
    assert doc["settings"] == {"schedule": "lpm", "window": 8, "page_size": 4,
                               "host_capacity": 3000, "eviction_policy": "lru", "warmup": 0.0}


@pytest.mark.parametrize("name", ["few_shot", "multi_turn", "agent", "long_prefix"])
def test_every_workload_gives_the_requested_number_of_requests(capsys, name):
    doc = run_json(capsys, "--workload", name, "--requests", "150", "--points", "2")
    assert doc["workload"]["requests"] == 150 == doc["unbounded"]["requests"]
    assert doc["workload"]["workload"] == name


def test_study_on_a_mooncake_file(capsys, tmp_path):
    path = write_mooncake(tmp_path / "mini.jsonl", MOONCAKE_ROWS)
    code, out, err = run(capsys, "study", "--trace", str(path), "--format", "mooncake",
                         "--points", "3")
    assert code == 0, err
    assert out.startswith("trace mini (mooncake: ")
    assert "4 requests, 14 ids (6 distinct), block size 512 tokens" in out
    assert "capacities in 512-token blocks" in out
    assert "bytes per stored block" in out and "bytes per stored token" in out
    doc = run_json(capsys, "--trace", str(path), "--format", "mooncake", "--capacities", "2,6")
    # unbounded: request 2 hits 3 of 4 blocks, request 3 hits 1 of 2, request 4 hits 4 of 5
    assert doc["unbounded"]["hit_ids"] == 8 and doc["footprint"] == 6
    assert doc["sweep"][-1]["hit_rate"] == pytest.approx(8 / 14)


def test_study_on_a_tokens_file(capsys, tmp_path):
    path = tmp_path / "toks.jsonl"
    path.write_text("[1, 2, 3, 4]\n[1, 2, 3, 5]\n[1, 2, 6]\n[1, 2, 3, 4, 7]\n")
    code, out, err = run(capsys, "study", "--trace", str(path), "--format", "tokens")
    assert code == 0, err
    assert out.startswith("trace toks (tokens: ") and "capacities in ids (= tokens)" in out
    doc = run_json(capsys, "--trace", str(path), "--format", "tokens")
    assert doc["unbounded"]["hit_ids"] == 3 + 2 + 4
    assert doc["capacities"][-1] == doc["footprint"] == 7


def test_study_on_several_namespaces(capsys, tmp_path):
    # two kv-cache-tester conversations with the same local ids: nothing is shared
    conv = {"block_size": 64, "requests": [
        {"t": 0.0, "type": "n", "in": 128, "out": 5, "hash_ids": [1, 2]},
        {"t": 1.0, "type": "n", "in": 192, "out": 5, "hash_ids": [1, 2, 3]}]}
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text(json.dumps(conv))
    code, out, err = run(capsys, "study", "--trace", str(tmp_path), "--format", "kvcache-tester")
    assert code == 0, err
    assert "2 namespaces" in out and "namespace << 40" in out
    doc = run_json(capsys, "--trace", str(tmp_path), "--format", "kvcache-tester")
    assert doc["unbounded"]["hit_ids"] == 4
    assert doc["index_memory"]["tokens_stored"] == 6 == doc["footprint"]


@pytest.mark.slow
def test_plot_writes_a_png(capsys, tmp_path):
    png = tmp_path / "curve.png"
    code, out, err = run(capsys, "study", *SMALL, "--points", "3", "--plot", str(png))
    assert code == 0, err
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    assert out.rstrip().endswith(f"plot written to {png}")
    doc = run_json(capsys, *SMALL, "--points", "3", "--plot", str(tmp_path / "b.png"))
    assert doc["plot"] == str(tmp_path / "b.png")


def rendered_overlaps(fig):
    """Pairs of visible, non-empty x tick labels that overlap once drawn."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found = []
    for ax in fig.axes:
        labels = [t for t in ax.get_xticklabels(which="both") if t.get_visible() and t.get_text()]
        boxes = [t.get_window_extent(renderer) for t in labels]
        found += [(labels[i].get_text(), labels[j].get_text())
                  for i in range(len(boxes)) for j in range(i + 1, len(boxes))
                  if boxes[i].overlaps(boxes[j])]
    return found


def test_plot_panels_title_and_ticks(capsys, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from radix_soa.cli import study as cli_study
    figures = []
    real = cli_study.plot_figure
    monkeypatch.setattr(cli_study, "plot_figure", lambda *a, **k: figures.append(real(*a, **k))
                        or figures[-1])
    path = write_mooncake(tmp_path / "mini.jsonl", MOONCAKE_ROWS)
    code, _, err = run(capsys, "study", "--trace", str(path), "--capacities",
                       "30000,35000,40000,45000,52000,60000", "--schedule", "lpm",
                       "--page-size", "2", "--host-capacity", "7", "--plot",
                       str(tmp_path / "a.png"))
    assert code == 0, err
    (fig,) = figures
    title = fig._suptitle.get_text()
    for part in ("mini (mooncake)", "schedule lpm (window 64)", "page size 2",
                 "host tier 7 blocks"):
        assert part in title, title
    hits, requests, memory = fig.axes
    assert "requests" in requests.get_ylabel() and "index memory" in memory.get_ylabel()
    assert not any("request" in line.get_label() for line in hits.get_lines())  # its own panel
    assert requests.get_lines()[0].get_ydata().tolist() == [0.5] * 6  # whole 2-block pages
    assert rendered_overlaps(fig) == []
    assert [t.get_text() for t in memory.get_xticklabels(which="minor")
            if t.get_visible() and t.get_text()] == []
    figures.clear()
    # a log axis over 1.5 decades labels its minor ticks: "3x10^4" ran into "4x10^4"
    run(capsys, "study", *SMALL, "--capacities", "2000,5000,20000,60000", "--plot",
        str(tmp_path / "b.png"))
    assert memory.get_xscale() == "linear" and figures[0].axes[2].get_xscale() == "log"
    assert rendered_overlaps(figures[0]) == []


def test_plot_puts_each_rate_beside_its_unbounded_value_in_the_same_unit(
        capsys, tmp_path, monkeypatch):
    """On a block trace the token rate (which counts the partial last
    block) is drawn with its own unbounded line, not against the block
    rate's; the middle panel says it is a share."""
    pytest.importorskip("matplotlib")
    from radix_soa.cli import study as cli_study
    figures = []
    real = cli_study.plot_figure
    monkeypatch.setattr(cli_study, "plot_figure", lambda *a, **k: figures.append(real(*a, **k))
                        or figures[-1])
    path = write_mooncake(tmp_path / "mini.jsonl", MOONCAKE_ROWS)
    code, _, err = run(capsys, "study", "--trace", str(path), "--points", "4", "--plot",
                       str(tmp_path / "a.png"))
    assert code == 0, err
    hits, requests, _ = figures[0].axes
    curves = [ln for ln in hits.get_lines() if len(ln.get_xdata()) > 2]
    flat = [ln for ln in hits.get_lines() if len(set(ln.get_ydata())) == 1
            and ln not in curves]
    labels = {ln.get_label().split(" (")[0] for ln in curves}
    assert labels == {"hit rate", "token hit rate"}
    for curve in curves:
        (mine,) = [ln for ln in flat if ln.get_color() == curve.get_color()]
        assert max(curve.get_ydata()) <= mine.get_ydata()[0] + 1e-12, curve.get_label()
    units = sorted(ln.get_label().split(" (")[0] for ln in flat)
    assert units == ["unbounded, blocks", "unbounded, tokens"]
    assert requests.get_ylabel().startswith("share of requests")


def test_plot_without_matplotlib_exits_2(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    line = assert_usage_error(capsys, "study", "--plot", str(tmp_path / "x.png"))
    assert "pip install radix-soa[plot]" in line


def test_progress_goes_to_stderr_only(capsys):
    code, out, err = run(capsys, "study", *SMALL, "--points", "2", "--progress", "--json")
    assert code == 0
    json.loads(out)
    assert "radix-soa: replay" in err  # tqdm bar or the plain counter
    code, out, err = run(capsys, "study", *SMALL, "--points", "2", "--no-progress")
    assert code == 0 and err == ""


@pytest.mark.parametrize("tqdm_installed", [True, False])
def test_loading_a_trace_shows_progress(capsys, tmp_path, monkeypatch, tqdm_installed):
    if not tqdm_installed:
        monkeypatch.setitem(sys.modules, "tqdm", None)
    path = tmp_path / "big.jsonl.gz"
    rows = [{"timestamp": i, "input_length": 1024, "output_length": 1, "hash_ids": [0, i + 1]}
            for i in range(3000)]
    path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    code, out, err = run(capsys, "study", "--trace", str(path), "--points", "2", "--progress",
                         "--json")
    assert code == 0, err
    assert json.loads(out)["workload"]["requests"] == 3000
    assert ("radix-soa: loading" in err) and ("radix-soa: loading 100%" in err) != tqdm_installed
    code, out, err = run(capsys, "study", "--trace", str(path), "--points", "2", "--no-progress")
    assert code == 0 and err == ""


def test_plain_counter_when_tqdm_is_missing(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    code, out, err = run(capsys, "study", *SMALL, "--points", "2", "--progress")
    assert code == 0 and "radix-soa: replay 3/3" in err


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"radix-soa {radix_soa.__version__}"


def test_csv_holds_every_number_and_nothing_else(capsys):
    code, out, err = run(capsys, "study", *SMALL, "--points", "3", "--csv")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    doc = run_json(capsys, *SMALL, "--points", "3")
    assert [int(r["capacity_ids"]) for r in rows] == doc["capacities"]
    assert [float(r["hit_rate"]) for r in rows] == [r["hit_rate"] for r in doc["sweep"]]
    assert [int(r["evicted_ids"]) for r in rows] == [r["evicted_ids"] for r in doc["sweep"]]
    assert rows[0]["host_capacity"] == ""  # None


def test_capacities_in_tokens_and_bytes_of_kv(capsys, tmp_path):
    path = write_mooncake(tmp_path / "mini.jsonl", MOONCAKE_ROWS)
    trace = ["--trace", str(path)]
    by_ids = run_json(capsys, *trace, "--capacities", "2,6")
    # 1,100 tokens hold 2 whole 512-token blocks; 3,100 tokens hold 6
    by_tokens = run_json(capsys, *trace, "--capacity-unit", "tokens", "--capacities", "1100,3.1k")
    assert by_tokens["capacities"] == [2, 6] and by_tokens["capacities_in_unit"] == [1024, 3072]
    assert [r["hit_rate"] for r in by_tokens["sweep"]] == [r["hit_rate"] for r in by_ids["sweep"]]
    # "what does 40 GB of KV buy me?" at 160 KiB per token: 40e9 // (512 x 163,840) = 476 blocks
    doc = run_json(capsys, *trace, "--capacity-unit", "bytes", "--kv-bytes-per-token", "160KiB",
                   "--capacities", "40GB,1GiB", "--host-capacity", "1GB")
    assert doc["capacities"] == [12, 476] and doc["kv_bytes_per_token"] == 163840
    assert doc["settings"]["host_capacity"] == 1_000_000_000 // (512 * 163840)
    assert doc["capacities_in_unit"] == [12 * 512 * 163840, 476 * 512 * 163840]
    # a B suffix sets the unit: --capacity-unit bytes may be left out
    suffixed = run_json(capsys, *trace, "--kv-bytes-per-token", "160KiB",
                        "--capacities", "40GB,1GiB", "--host-capacity", "1GB")
    assert suffixed["capacities"] == doc["capacities"] and suffixed["capacity_unit"] == "bytes"
    code, out, err = run(capsys, "study", *trace, "--capacity-unit", "bytes",
                         "--kv-bytes-per-token", "160KiB", "--capacities", "40GB")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1].startswith("capacities in bytes of KV; unbounded footprint 503 MB of KV "
                               "(6 blocks)")
    head, rows = table_rows(lines)
    assert lines[head + 1].split()[:3] == ["(KV", "bytes)", "(blocks)"]
    assert rows[0][:3] == ["39.9", "GB", "476"]
    assert "at 163,840 bytes per token" in out
    assert "summary: 39.9 GB of KV (243,712 tokens, 476 blocks) is the smallest" in out
    # the rounding down to whole blocks is said, not left for the reader to spot
    assert lines[2] == ("capacities are whole blocks (83.9 MB each), rounded down: "
                        "40.0 GB -> 39.9 GB (476 blocks)")
    code, out, err = run(capsys, "study", *trace, "--kv-bytes-per-token", "160KiB",
                         "--capacities", "1GB,10GB", "--host-capacity", "1GB")
    assert code == 0, err
    assert out.splitlines()[2] == (
        "capacities are whole blocks (83.9 MB each), rounded down: 1.00 GB -> 923 MB "
        "(11 blocks), 10.0 GB -> 9.98 GB (119 blocks), host tier 1.00 GB -> 923 MB (11 blocks)")
    assert doc["capacities_asked"] == [1 << 30, 40 * 10**9] and "40.0 GB -> 39.9 GB" in \
        doc["rounding"]
    whole = run_json(capsys, *trace, "--kv-bytes-per-token", "160KiB", "--capacities",
                     f"{3 * 512 * 163840}B")
    assert whole["capacities"] == [3] and whole["rounding"] is None
    assert by_tokens["rounding"] == ("capacities are whole blocks (512 tokens each), rounded "
                                     "down: 1,100 tokens -> 1,024 tokens (2 blocks), 3,100 "
                                     "tokens -> 3,072 tokens (6 blocks)")


def test_traces_from_gzip_and_standard_input_with_the_format_detected(capsys, tmp_path,
                                                                      monkeypatch):
    rows = "".join(json.dumps(r) + "\n" for r in MOONCAKE_ROWS).encode()
    packed = tmp_path / "mini.jsonl.gz"
    packed.write_bytes(gzip.compress(rows))
    doc = run_json(capsys, "--trace", str(packed), "--capacities", "6")
    assert doc["workload"]["format"] == "mooncake" and doc["workload"]["format_detected"]
    assert doc["workload"]["name"] == "mini" and doc["unbounded"]["hit_ids"] == 8
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(rows)))
    code, out, err = run(capsys, "study", "--trace", "-", "--capacities", "6")
    assert code == 0, err
    assert out.startswith("trace stdin (mooncake: <stdin>): 4 requests")


def test_warmup_scores_like_kvcache_simulator(capsys, tmp_path):
    path = write_mooncake(tmp_path / "mini.jsonl", MOONCAKE_ROWS)
    doc = run_json(capsys, "--trace", str(path), "--warmup", "0.5", "--capacities", "6")
    r = doc["sweep"][0]
    # requests 3 and 4 are scored: hits 1 of 2 and 4 of 5 blocks; tokens min(512, 1024) and
    # min(4 x 512, 2100)
    assert r["scored_requests"] == 2 and r["hit_rate"] == pytest.approx(5 / 7)
    assert r["token_hit_rate"] == pytest.approx((512 + 2048) / (1024 + 2100))
    assert doc["settings"]["warmup"] == 0.5
    code, out, _ = run(capsys, "study", "--trace", str(path), "--warmup", "0.5")
    assert "rates score the last 2 requests (warmup 0.5)" in out
    assert "scored: the last 2 of 4 requests (the first 50% of arrivals only warm" in out
    assert "token hit (tokens): prompt tokens served by the device" in out


def test_the_default_subcommand_is_study_unless_the_options_are_builds(capsys):
    code, out, err = run(capsys, "--requests", "100", "--points", "2", "--json")
    assert code == 0, err
    assert len(json.loads(out)["sweep"]) == 2  # the study
    code, out, err = run(capsys, "--seed", "1", "--sequences=50", "--json")
    assert code == 0, err
    assert json.loads(out)["sequences"] == 50  # build


@pytest.mark.parametrize("argv, expect", [
    (["--trace", "x.jsonl", "--format", "csv"], "invalid choice: 'csv'"),
    (["--trace", "{tmp}/missing.jsonl", "--format", "mooncake"], "not found"),
    (["--trace", "{tmp}/bad.jsonl", "--format", "mooncake"], "line 2"),
    (["--capacities=-5"], "must be >= 0"),
    (["--capacities", "100,-5"], "must be >= 0"),
    (["--capacities", "1000,2.5"], "'2.5' is not an integer"),
    (["--capacities", "lots"], "is not an integer"),
    (["--capacities", "10", "--points", "3"], "not allowed with argument"),
    (["--points", "0"], "must be >= 1"),
    (["--window", "0"], "must be >= 1"),
    (["--trace", "{tmp}/odd.txt"], "cannot tell the trace format: it starts with 'hello"),
    (["--trace", "{tmp}/bad.jsonl", "--format", "kvcache-tester"],
     "looks like a mooncake trace, not kvcache-tester"),
    (["--capacity-unit", "bytes"], "capacities in bytes need --kv-bytes-per-token"),
    (["--capacities", "10GB"], "capacities in bytes need --kv-bytes-per-token"),
    (["--capacities", "10GB", "--capacity-unit", "tokens", "--kv-bytes-per-token", "1KiB"],
     "--capacities is in bytes (a B suffix, as in 10GB) but --capacity-unit is tokens"),
    (["--capacities", "10GB,5000"], "mixes sizes in bytes"),
    (["--capacities", "10GB", "--host-capacity", "300", "--kv-bytes-per-token", "1KiB"],
     "--capacities is in bytes (a B suffix) but --host-capacity is not"),
    (["--capacity-unit", "blocks"], "invalid choice: 'blocks'"),
    (["--kv-bytes-per-token", "0"], "--kv-bytes-per-token must be >= 1"),
    (["--kv-bytes-per-token", "lots"], "is not an integer"),
    (["--capacities", "1.5"], "a fraction needs a suffix"),
    (["--capacities", "1.0005k"], "is not a whole number"),
    (["--capacities", "40XB"], "is not an integer"),
    (["--host-capacity", "-3"], "--host-capacity must be >= 0"),
    (["--kv-bytes-per-token", "-5"], "--kv-bytes-per-token must be >= 1, got -5"),
    (["--warmup", "1"], "warmup must be in [0, 1)"),
    (["--warmup", "half"], "expected a number in [0, 1)"),
    (["--warmup", "nan"], "warmup must be in [0, 1)"),
    (["--json", "--csv"], "not allowed with argument"),
    (["--trace", "{tmp}/t.zst"], "needs the 'zstandard' module"),
    (["--format", "tokens"], "--format needs --trace"),
    (["--trace", "{tmp}/bad.jsonl", "--format", "mooncake", "--workload", "chat"], "not both"),
    (["--trace", "{tmp}/bad.jsonl", "--format", "mooncake", "--requests", "5"], "--requests"),
    (["--workload", "rag"], "invalid choice: 'rag'"),
    (["--plot", "{tmp}/out.foo"], "--plot: file name must end in one of"),
    (["--plot", "{tmp}/no/such/dir/out.png"], "does not exist"),
    (["--no-such-option"], "unrecognized arguments"),
    (["--workers", "0"], "must be >= 1"),
    (["--workers", "two"], "expected an integer"),
    (["--workers", "2,"], "comma-separated list of worker counts"),
    (["--workers", "99999"], "must be <= 4096"),
    (["--router", "nearest"], "unknown router 'nearest'"),
    (["--workers", "2", "--host-capacity", "10"], "no host tier"),
    (["--router", "cache_aware", "--schedule", "lpm"], "--schedule must be fcfs"),
])
def test_bad_usage_exits_2_with_one_line(capsys, tmp_path, monkeypatch, argv, expect):
    write_mooncake(tmp_path / "bad.jsonl", MOONCAKE_ROWS[:1])
    (tmp_path / "odd.txt").write_text("hello\n")
    (tmp_path / "t.zst").write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 8)
    monkeypatch.setitem(sys.modules, "zstandard", None)  # as if it were not installed
    with open(tmp_path / "bad.jsonl", "a") as f:
        f.write('{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [1.5]}\n')
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    line = assert_usage_error(capsys, "study", *argv)
    assert expect in line


def test_help_lists_both_subcommands(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "study" in out and "build" in out


# ----------------------------------------------------------------------------
# build (the default when only its own options are given)
# ----------------------------------------------------------------------------

def test_build_runs_without_its_name_given_its_own_options(capsys):
    code, out, err = run(capsys, "--sequences", "200", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["sequences"] == 200 and report["all_found"] is True
    code, out, _ = run(capsys, "build", "--sequences", "100", "--prompts", "3", "--prompt-len", "20")
    assert code == 0 and out.startswith("workload ")


def test_build_rejects_a_zero_count(capsys):
    assert_usage_error(capsys, "build", "--sequences", "0")


# ----------------------------------------------------------------------------
# the installed entry point, and the real traces
# ----------------------------------------------------------------------------

def test_installed_entry_point_study_json(tmp_path):
    exe = Path(sys.executable).with_name("radix-soa")
    exe = str(exe) if exe.exists() else shutil.which("radix-soa")
    if exe is None:
        pytest.skip("the radix-soa entry point is not installed (pip install -e .)")
    proc = subprocess.run([exe, "study", "--json", *SMALL, "--points", "3"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # stderr is a pipe: no progress bar
    doc = json.loads(proc.stdout)
    assert doc["workload"]["requests"] == 300 and len(doc["sweep"]) == 3
    bad = subprocess.run([exe, "study", "--trace", str(tmp_path / "nope"), "--format", "tokens"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.splitlines() == [f"radix-soa: error: trace file not found: "
                                       f"{tmp_path / 'nope'}"]


def test_real_mooncake_conversation_trace(capsys):
    path = TRACES / "mooncake-fast25" / "conversation_trace.jsonl"
    if not path.exists():
        pytest.skip(f"real traces not available ({path} is absent)")
    doc = run_json(capsys, "--trace", str(path), "--format", "mooncake", "--points", "5")
    assert doc["workload"]["requests"] == 12031 and doc["workload"]["block_size"] == 512
    assert doc["unbounded"]["hit_rate"] == pytest.approx(0.366, abs=0.001)
    assert len(doc["sweep"]) == 5
    assert doc["sweep"][-1]["hit_rate"] == pytest.approx(doc["unbounded"]["hit_rate"])
    rates = [r["hit_rate"] for r in doc["sweep"]]
    assert rates == sorted(rates)


# ----------------------------------------------------------------------------
# study over N workers
# ----------------------------------------------------------------------------

CLUSTER = [*SMALL, "--workers", "1,3", "--router", "round_robin,cache_aware"]


def test_cluster_study_prints_a_row_per_workers_router_and_capacity(capsys):
    code, out, err = run(capsys, "study", *CLUSTER, "--capacities", "500,2000")
    assert code == 0, err
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:2] == ["workers", "router"])
    rows = [line.split() for line in lines[head + 1:head + 9]]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (w, r, c) for w in ("1", "3") for r in ("round_robin", "cache_aware")
        for c in ("500", "2,000")]
    # the numbers are the library's
    trace = generated_trace("chat", 300, 3)[0]
    direct = radix_soa.replay_cluster(trace, workers=3, capacity=2000, router="cache_aware")
    assert rows[-1][3] == f"{direct.hit_rate:.3f}"
    assert rows[-1][6] == f"{direct.load_imbalance:.2f}"  # "prefill saved" takes two cells
    assert "3 workers, capacity 2,000: cache_aware saves" in out
    assert "load imbalance" in out


def test_cluster_study_json_and_csv(capsys, tmp_path):
    doc = run_json(capsys, *CLUSTER)
    assert doc["settings"]["workers"] == [1, 3]
    assert doc["settings"]["routers"] == ["round_robin", "cache_aware"]
    caps = doc["settings"]["capacities"]
    assert len(caps) == 4 and len(doc["rows"]) == 2 * 2 * 4  # 4 capacities by default
    trace = generated_trace("chat", 300, 3)[0]
    row = doc["rows"][-1]
    direct = radix_soa.replay_cluster(trace, workers=3, capacity=caps[-1], router="cache_aware")
    assert row["hit_rate"] == direct.hit_rate
    assert row["prefill_tokens_saved"] == direct.prefill_tokens_saved
    assert doc["per_worker"][-1]["requests"] == direct.per_worker["requests"].tolist()
    code, out, err = run(capsys, "study", *CLUSTER, "--points", "2", "--csv")
    assert code == 0, err
    table = list(csv.DictReader(io.StringIO(out)))
    assert len(table) == 2 * 2 * 2
    assert [t["router"] for t in table[:4]] == ["round_robin"] * 2 + ["cache_aware"] * 2
    assert float(table[-1]["load_imbalance"]) >= 1.0


def test_cluster_study_defaults_and_plot(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "cluster.png"
    code, out, err = run(capsys, "study", *SMALL, "--router", "kv_overlap", "--points", "2",
                         "--plot", str(png))
    assert code == 0, err
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    assert "1 clusters (8 workers x kv_overlap)" in out
    doc = run_json(capsys, *SMALL, "--workers", "2", "--points", "1")
    assert doc["settings"]["routers"] == ["round_robin", "cache_aware", "kv_overlap"]


def test_cluster_study_on_the_mooncake_conversation_trace(capsys):
    path = TRACES / "mooncake-fast25" / "conversation_trace.jsonl"
    if not path.exists():
        pytest.skip(f"real traces not present at {path}")
    doc = run_json(capsys, "--trace", str(path), "--workers", "8", "--router",
                   "round_robin,cache_aware", "--capacities", "20000")
    rr, ca = doc["rows"]
    assert rr["router"] == "round_robin" and ca["router"] == "cache_aware"
    assert ca["prefill_tokens_saved"] > 2 * rr["prefill_tokens_saved"]


def test_python_dash_m_runs_the_command():
    import subprocess
    import sys as _sys

    done = subprocess.run([_sys.executable, "-m", "radix_soa", "--version"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == f"radix-soa {radix_soa.__version__}"
    bad = subprocess.run([_sys.executable, "-m", "radix_soa", "study", "--points", "0"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_warmup_compiles_everything_and_says_so(capsys):
    from radix_soa._warmup import GROUPS

    assert main(["warmup"]) == 0
    out = capsys.readouterr().out.splitlines()
    # a line per kernel group, in order, as each is done; then the total
    assert out[0] == f"compiling {len(GROUPS)} kernel groups"
    assert [line.split()[0] for line in out[1:-1]] == [g[0] for g in GROUPS]
    assert out[-1].startswith("kernels ready in ") and "cluster replays exercised" in out[-1]


@pytest.mark.slow
def test_warmup_jobs_runs_every_group_in_child_processes(capsys):
    from radix_soa._warmup import GROUPS

    assert main(["warmup", "--jobs", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"compiling {len(GROUPS)} kernel groups in up to 2 processes"
    assert sorted(line.split()[0] for line in out[1:-1]) == sorted(g[0] for g in GROUPS)


@pytest.mark.parametrize("jobs", ["0", "-1", "two", "257"])
def test_warmup_jobs_must_be_a_small_positive_int(capsys, jobs):
    assert "--jobs" in assert_usage_error(capsys, "warmup", "--jobs", jobs)
