"""``radix-soa traces``: the catalog of public traces and their download,
checked before anything is kept (downloads run from local file:// URLs)."""

import hashlib
from pathlib import Path

import pytest

import data_paths  # $RADIX_SOA_TRACES, else ../shared/data/traces

from radix_soa.cli import main
from radix_soa.studies import catalog
from radix_soa.studies.catalog import DownloadError, PublicTrace, TraceFile
from radix_soa.studies.traces import load_trace

DATA = data_paths.TRACES
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"trace data not found at {DATA}")

MOONCAKE_LINES = b"".join(b'{"timestamp": %d, "input_length": 600, "output_length": 5, '
                          b'"hash_ids": [0, %d]}\n' % (i, i + 1) for i in range(4))


def git_blob(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@pytest.fixture
def mirror(tmp_path, monkeypatch):
    """A mirror directory with two files, and a catalog of two traces over it:
    one checked by SHA-256, one by git blob id."""
    root = tmp_path / "mirror"
    (root / "t").mkdir(parents=True)
    (root / "t" / "a.jsonl").write_bytes(MOONCAKE_LINES)
    (root / "t" / "b.jsonl").write_bytes(MOONCAKE_LINES[:100] + MOONCAKE_LINES[100:])
    sha = hashlib.sha256(MOONCAKE_LINES).hexdigest()
    traces = (
        PublicTrace("tiny", "a tiny trace", "mooncake", "CC0", "here", root.as_uri() + "/",
                    (TraceFile("t/a.jsonl", len(MOONCAKE_LINES), sha),)),
        PublicTrace("blob", "checked by its git blob id", "mooncake", "CC0", "here",
                    root.as_uri() + "/", (TraceFile("t/b.jsonl", git_blob=git_blob(
                        MOONCAKE_LINES)[:12]),)),
    )
    monkeypatch.setattr(catalog, "TRACES", traces)
    return root


def test_get_downloads_checks_and_keeps_a_file(mirror, tmp_path):
    for name in ("tiny", "blob"):
        out = tmp_path / f"got-{name}"
        (path,) = catalog.get(name, out)
        assert path.read_bytes() == MOONCAKE_LINES and path.parent == out / name
        assert len(load_trace(path)) == 4
        assert [p.name for p in (out / name).iterdir()] == [path.name]  # no temporary left
        assert path.stat().st_mode & 0o777 == 0o644
        assert catalog.get(name, out) == [path]  # already there and checked: kept


def test_a_file_that_does_not_match_its_checksum_is_never_kept(mirror, tmp_path):
    (mirror / "t" / "a.jsonl").write_bytes(MOONCAKE_LINES.replace(b"600", b"601"))
    (mirror / "t" / "b.jsonl").write_bytes(MOONCAKE_LINES + b"\n")
    for name, why in (("tiny", "SHA-256"), ("blob", "bytes|git blob")):
        out = tmp_path / f"bad-{name}"
        with pytest.raises(DownloadError, match=why):
            catalog.get(name, out)
        assert not out.exists()  # nothing kept, no empty directory left


def test_an_existing_different_file_is_not_overwritten(mirror, tmp_path):
    out = tmp_path / "out"
    (out / "tiny").mkdir(parents=True)
    (out / "tiny" / "a.jsonl").write_bytes(b"mine\n")
    with pytest.raises(FileExistsError, match="not the catalog's file"):
        catalog.get("tiny", out)
    assert (out / "tiny" / "a.jsonl").read_bytes() == b"mine\n"


def test_unreachable_and_unknown(mirror, tmp_path):
    with pytest.raises(DownloadError, match="cannot download"):
        catalog.get("tiny", tmp_path / "x", base=(tmp_path / "nowhere").as_uri())
    assert not (tmp_path / "x").exists()  # a failed get leaves no empty directory
    (tmp_path / "y").mkdir()
    with pytest.raises(DownloadError, match="no such directory"):
        catalog.get("tiny", tmp_path / "y", base=str(tmp_path / "nowhere"))
    assert list((tmp_path / "y").iterdir()) == []  # kept (not made by get), emptied of NAME/
    with pytest.raises(KeyError, match="no public trace 'nope'"):
        catalog.get("nope", tmp_path)


def test_the_command_lists_and_gets(mirror, tmp_path, capsys):
    assert main(["traces"]) == 0
    out = capsys.readouterr().out
    assert "tiny\n  a tiny trace\n  format mooncake" in out and "traces get NAME --to DIR" in out
    assert main(["traces", "get", "tiny", "--to", str(tmp_path / "d"), "--no-progress"]) == 0
    got = capsys.readouterr()
    assert got.out.strip() == str(tmp_path / "d" / "tiny" / "a.jsonl")
    assert "study --trace" in got.err
    # a mirror given on the command line
    other = tmp_path / "other"
    (other / "t").mkdir(parents=True)
    (other / "t" / "a.jsonl").write_bytes(MOONCAKE_LINES)
    assert main(["traces", "get", "tiny", "--to", str(tmp_path / "e"), "--from",
                 other.as_uri(), "--no-progress"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("layout", ["t/a.jsonl", "shipped/a.jsonl", "tiny/a.jsonl", "a.jsonl"])
def test_from_takes_the_source_layout_the_shared_layout_and_a_plain_directory(
        mirror, tmp_path, monkeypatch, layout, capsys):
    """``--from DIR`` (a path, not only a file:// URL) holding the file at
    the source's path, in the trace's folder of the shared data, in get's
    own NAME/ directory, or right there."""
    (tiny, blob) = catalog.TRACES
    monkeypatch.setattr(catalog, "TRACES", (PublicTrace(
        tiny.name, tiny.title, tiny.format, tiny.license, tiny.source,
        "https://example.invalid/", tiny.files, folder="shipped"), blob))
    src = tmp_path / "src"
    (src / layout).parent.mkdir(parents=True, exist_ok=True)
    (src / layout).write_bytes(MOONCAKE_LINES)
    assert main(["traces", "get", "tiny", "--to", str(tmp_path / "out"), "--from", str(src),
                 "--no-progress"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "out" / "tiny" / "a.jsonl")
    assert (tmp_path / "out" / "tiny" / "a.jsonl").read_bytes() == MOONCAKE_LINES
    (path,) = catalog.get("tiny", tmp_path / "url", base=src.as_uri())
    assert path.read_bytes() == MOONCAKE_LINES


def test_each_trace_gets_a_directory_of_its_own(mirror, tmp_path):
    """Two traces into one --to: neither directory mixes formats, so
    ``study --trace DIR/NAME`` reads one trace; a directory that does mix
    them is refused, not read with the other format's files skipped."""
    out = tmp_path / "traces"
    (a,) = catalog.get("tiny", out)
    (b,) = catalog.get("blob", out)
    assert a.parent != b.parent and sorted(p.name for p in out.iterdir()) == ["blob", "tiny"]
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "conversation_trace.jsonl").write_bytes(MOONCAKE_LINES)
    (mixed / "trace_0001.json").write_text(
        '{"block_size": 64, "requests": [{"t": 0, "type": "n", "in": 64, "out": 1, '
        '"hash_ids": [1]}]}')
    with pytest.raises(ValueError, match=r"holds 1 JSONL trace file \(conversation_trace.jsonl\)"):
        load_trace(mixed)


@pytest.mark.parametrize("argv, expect", [
    (["traces", "get", "nope", "--to", "x"], "no public trace 'nope'"),
    (["traces", "get", "tiny"], "needs --to DIR"),
    (["traces", "fetch"], "invalid choice: 'fetch'"),
])
def test_bad_traces_commands_exit_2_with_one_line(mirror, capsys, argv, expect):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and expect in err


@needs_data
def test_the_catalogs_checksums_are_the_public_files(tmp_path):
    """The digests pinned in the catalog are those of the files the project
    reads in place (a local mirror of the same paths downloads and checks)."""
    sources = {"mooncake-conversation": DATA / "mooncake-fast25",
               "mooncake-synthetic": DATA / "mooncake-fast25",
               "kvcache-tester-claude-code": DATA / "kv-cache-tester-claude-code"}
    for name, folder in sources.items():
        trace = catalog.find(name)
        mirror = tmp_path / f"m-{name}"
        for spec in trace.files:
            target = mirror / spec.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(folder / spec.name)
            assert catalog.check_file(folder / spec.name, spec) is None, spec.name
        got = catalog.get(name, tmp_path / f"got-{name}", base=mirror.as_uri())
        assert [p.name for p in got] == [s.name for s in trace.files]


@needs_data
def test_from_reads_the_shared_data_as_it_lies(tmp_path):
    """``--from`` the shared data directory itself (its own layout:
    mooncake-fast25/, kv-cache-tester-claude-code/)."""
    for name in ("mooncake-synthetic", "kvcache-tester-claude-code"):
        got = catalog.get(name, tmp_path / "traces", base=str(DATA))
        assert [p.name for p in got] == [s.name for s in catalog.find(name).files]
        assert {p.parent for p in got} == {tmp_path / "traces" / name}
    assert len(load_trace(tmp_path / "traces" / "kvcache-tester-claude-code")) > 0


def test_the_tests_read_the_traces_where_the_setting_says(tmp_path):
    assert data_paths.traces_dir({"RADIX_SOA_TRACES": str(tmp_path)}) == tmp_path
    assert data_paths.traces_dir({}) == data_paths.DEFAULT
    assert data_paths.DEFAULT.parts[-3:] == ("shared", "data", "traces")
