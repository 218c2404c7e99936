"""The public request traces the loaders read: where each comes from, its
format, size and license, and ``get`` to download one, checked before it is
kept.

The project ships no trace (they are not ours to redistribute); this
catalog says where to find them. Each file is pinned to a commit of its
source repository and checked on arrival: by its SHA-256 where it is known
here, else by the prefix of its git blob id (what the source's own git
history names it), so a download never keeps a byte it did not check.

>>> [t.name for t in TRACES][:3]
['mooncake-conversation', 'mooncake-synthetic', 'mooncake-toolagent']
>>> find("mooncake-conversation").format, find("mooncake-conversation").license
('mooncake', 'Apache-2.0')
"""

import hashlib
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Tuple

__all__ = ["TraceFile", "PublicTrace", "TRACES", "find", "get", "check_file", "describe",
           "DownloadError"]

_MOONCAKE = ("https://raw.githubusercontent.com/kvcache-ai/Mooncake/"
             "3b5a594133958449a1feaf1c9e0fc1b553e34a28/")
_KV_TESTER = ("https://raw.githubusercontent.com/callanjfox/kv-cache-tester/"
              "94f6046dfd9c0c8bc0cdb24a5aa6579bac8669bf/")


class DownloadError(OSError):
    """A download that failed or did not match its checksum (nothing kept)."""


@dataclass(frozen=True)
class TraceFile:
    """One file of a public trace: its path under the source's base URL,
    its size and its checksum (``sha256``, else ``git_blob``: a prefix of its
    git blob id)."""

    path: str
    size: Optional[int] = None
    sha256: Optional[str] = None
    git_blob: Optional[str] = None

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class PublicTrace:
    """A public trace: ``name`` (what ``get`` takes), what it is, its format
    (a ``load_trace`` format name), where it comes from (``base`` + each
    file's path, pinned to a commit) and its license; ``folder``: the
    directory a copy of the project's shared data keeps its files in
    (``mooncake-fast25/``, ``kv-cache-tester-claude-code/``), which ``get``
    also looks for under a mirror."""

    name: str
    title: str
    format: str
    license: str
    source: str
    base: str
    files: Tuple[TraceFile, ...]
    note: str = ""
    folder: str = ""

    @property
    def size(self) -> Optional[int]:
        sizes = [f.size for f in self.files]
        return None if None in sizes else sum(sizes)  # type: ignore[arg-type]


TRACES: Tuple[PublicTrace, ...] = (
    PublicTrace(
        "mooncake-conversation", "Mooncake FAST'25, conversation (Kimi chat, 12,031 requests)",
        "mooncake", "Apache-2.0", "github.com/kvcache-ai/Mooncake FAST25-release/traces",
        _MOONCAKE, (TraceFile("FAST25-release/traces/conversation_trace.jsonl", 3_029_533,
                              "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df"),),
        "512-token blocks; ids are prefix-chained hashes", "mooncake-fast25"),
    PublicTrace(
        "mooncake-synthetic", "Mooncake FAST'25, synthetic (Poisson arrivals, 3,993 requests)",
        "mooncake", "Apache-2.0", "github.com/kvcache-ai/Mooncake FAST25-release/traces",
        _MOONCAKE, (TraceFile("FAST25-release/traces/synthetic_trace.jsonl", 1_136_313,
                              "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131"),),
        "512-token blocks", "mooncake-fast25"),
    PublicTrace(
        "mooncake-toolagent", "Mooncake FAST'25, tool & agent (23,608 requests)",
        "mooncake", "Apache-2.0", "github.com/kvcache-ai/Mooncake FAST25-release/traces",
        _MOONCAKE, (TraceFile("FAST25-release/traces/toolagent_trace.jsonl",
                              git_blob="b765599d1e08"),),
        "512-token blocks; checked by its git blob id", "mooncake-fast25"),
    PublicTrace(
        "mooncake-arxiv", "Mooncake arXiv report, Table 1 (23,608 requests)",
        "mooncake", "Apache-2.0", "github.com/kvcache-ai/Mooncake FAST25-release/arxiv-trace",
        _MOONCAKE, (TraceFile("FAST25-release/arxiv-trace/mooncake_trace.jsonl",
                              git_blob="d68d1c6ce27b"),),
        "512-token blocks; checked by its git blob id", "mooncake-fast25"),
    PublicTrace(
        "kvcache-tester-claude-code",
        "Claude Code agent sessions (WEKA kv-cache-tester), 12 of its 739 conversations",
        "kvcache-tester", "Apache-2.0", "github.com/callanjfox/kv-cache-tester traces/",
        _KV_TESTER, tuple(TraceFile(f"traces/trace_{k}.json", size, sha) for k, size, sha in (
            ("0010", 1_186_228, "c128af368553d3f1304762644715e1bf3239aa002faaef1ee71716a7f5d33207"),
            ("0178", 4_146_929, "a570453c48f3a8b99b7be38356ec8ea67f47c99856f6cbc25e194a77f21ab8f5"),
            ("0201", 72_018, "5ddc07dfc99fee319bfa3da83ffec2ea70e63cc2df15f9a55e2ba915a7f3b686"),
            ("0247", 201_403, "ad6acd5b155b75eef7b82c46b19765a159808d4ef13f91ed92b0b7212b222771"),
            ("0282", 498_506, "a405e7bb126d0aedae10a78ab558a6753a01c7b78fc0a50523bd87bf1e79fbf7"),
            ("0295", 2_954_767, "193304fbc06c636ce9099b0d35b7709299175eda1aab5221072479ba9b163307"),
            ("0348", 286_188, "7b970c782803d04e865db68bbf524063a40bb23d37bc0bf51d6ad28899fc6b0d"),
            ("0504", 2_707, "a902593802a8d08f95e4ad9f08a4a254d6511ad8d72faa403945f61c2cbef58f"),
            ("0520", 2_192_421, "8b9a9617835ebd6f8dabf1570e76ad594327a1ebf26266c926777ccc4d8e398b"),
            ("0585", 1_165_697, "b717de63416e37c85197e4cbba4f997202afdfd953b9e5737a73b12de2c02bb0"),
            ("0601", 375_894, "782ee3edc15955b58365ebf743ffed424138bf3bfeefae4a5d67d19d3ce708cb"),
            ("0716", 798_870, "4dde52060e17ff113fdfa8542a571d485f7befb66fffc696a3c4383720bc4379"),
        )),
        "64-token blocks; ids local to each file (load the directory: one namespace a file)",
        "kv-cache-tester-claude-code"),
)


def find(name: str) -> PublicTrace:
    """The catalog entry called ``name`` (``KeyError`` naming the choices)."""
    for t in TRACES:
        if t.name == name:
            return t
    raise KeyError(f"no public trace {name!r}; the catalog has {', '.join(t.name for t in TRACES)}")


def _git_blob_id(path: Path) -> str:
    h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_file(path: Path, spec: TraceFile) -> Optional[str]:
    """None if the file at ``path`` is ``spec``'s, else what is wrong."""
    size = path.stat().st_size
    if spec.size is not None and size != spec.size:
        return f"{spec.name} holds {size:,} bytes, not {spec.size:,}"
    if spec.sha256 is not None:
        got = _sha256(path)
        return None if got == spec.sha256 else f"{spec.name}: SHA-256 {got} is not {spec.sha256}"
    if spec.git_blob is not None:
        got = _git_blob_id(path)
        return (None if got.startswith(spec.git_blob)
                else f"{spec.name}: git blob id {got} is not {spec.git_blob}...")
    return f"{spec.name}: no checksum to check it by"


def get(name: str, to: os.PathLike, base: Optional[str] = None, timeout: float = 60.0,
        progress: Optional[Callable[[str, int, Optional[int]], None]] = None) -> List[Path]:
    """Download the public trace ``name`` into ``to/NAME/`` (a directory
    of its own, made if missing, so a directory never mixes two traces'
    formats); returns the paths of its files.

    ``base`` replaces the source's base URL: a mirror's URL, or a directory
    (a path or a ``file://`` URL) holding, for each file, the source's path
    (``FAST25-release/traces/...``), the shared data's layout
    (``mooncake-fast25/...``, ``kv-cache-tester-claude-code/...``: the
    trace's ``folder``), ``get``'s own (``NAME/...``) or the file itself,
    tried in that order. Each file is written beside its target, checked
    (size, then SHA-256 or git blob id), made readable by all (0644) and only
    then renamed into place; a file already there that checks out is kept,
    one that does not is never overwritten; a failed get removes the
    directories it made. ``progress(file, bytes_done, bytes_total)`` is
    called as it downloads. Raises ``KeyError`` (unknown name),
    ``DownloadError`` (unreachable, or a checksum mismatch) or
    ``FileExistsError``.
    """
    trace = find(name)
    top = Path(to)
    if top.exists() and not top.is_dir():
        raise NotADirectoryError(f"{top} exists and is not a directory")
    root = top / trace.name
    if root.exists() and not root.is_dir():
        raise NotADirectoryError(f"{root} exists and is not a directory")
    made = [d for d in (root, *root.parents) if not d.exists()]
    root.mkdir(parents=True, exist_ok=True)
    try:
        return [_get_file(trace, spec, root, _base_url(trace, base), timeout, progress)
                for spec in trace.files]
    except BaseException:
        for d in made:  # innermost first; only directories this call made, if empty
            try:
                d.rmdir()
            except OSError:
                break
        raise


def _base_url(trace, base):
    """The base URL to fetch from: the source's, a mirror's, or a local
    directory's ``file://`` URL; always ending in ``/``."""
    if base is None:
        return trace.base
    if urllib.parse.urlparse(base).scheme not in ("http", "https", "file", "ftp"):
        folder = Path(base).expanduser()
        if not folder.is_dir():
            raise DownloadError(f"--from {base}: no such directory (a mirror is a URL or a "
                                "directory)")
        return folder.resolve().as_uri() + "/"
    return base if base.endswith("/") else base + "/"


def _candidates(trace, spec, url_base):
    """Where ``spec`` may be under ``url_base``, in the order tried."""
    if url_base == trace.base:
        return [urllib.parse.urljoin(url_base, spec.path)]
    paths = [spec.path] + ([f"{trace.folder}/{spec.name}"] if trace.folder else []) + [
        f"{trace.name}/{spec.name}", spec.name]
    return [urllib.parse.urljoin(url_base, p) for p in dict.fromkeys(paths)]


def _missing(exc):
    """True when a fetch failed because the file is not there (try the next
    place), not because the mirror is unreachable."""
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code in (403, 404, 410)
    reason = getattr(exc, "reason", exc)
    return isinstance(reason, (FileNotFoundError, NotADirectoryError, IsADirectoryError))


def _get_file(trace, spec, root, url_base, timeout, progress):
    dest = root / spec.name
    if dest.exists():
        wrong = check_file(dest, spec)
        if wrong is not None:
            raise FileExistsError(f"{dest} exists and is not the catalog's file ({wrong}); "
                                  "move it away first")
        return dest
    urls = _candidates(trace, spec, url_base)
    fd, tmp = tempfile.mkstemp(prefix=f".{spec.name}.", suffix=".part", dir=root)
    try:
        with os.fdopen(fd, "wb") as f:
            for i, url in enumerate(urls):
                try:
                    with urllib.request.urlopen(url, timeout=timeout) as r:
                        length = r.headers.get("Content-Length")
                        total = int(length) if length and length.isdigit() else spec.size
                        done = 0
                        for chunk in iter(lambda: r.read(1 << 20), b""):
                            f.write(chunk)
                            done += len(chunk)
                            if progress is not None:
                                progress(spec.name, done, total)
                    break
                except (urllib.error.URLError, OSError, ValueError) as exc:
                    if _missing(exc) and i + 1 < len(urls) and f.tell() == 0:
                        continue
                    reason = getattr(exc, "reason", exc)
                    tried = f" (nor at {', '.join(urls[:i])})" if i else ""
                    raise DownloadError(f"cannot download {url}: {reason}{tried}") from None
        wrong = check_file(Path(tmp), spec)
        if wrong is not None:
            raise DownloadError(f"{url}: {wrong}; nothing kept")
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return dest


def describe() -> str:
    """The catalog as text, one trace a paragraph (what ``radix-soa traces``
    prints)."""
    lines = []
    for t in TRACES:
        size = "size unknown" if t.size is None else f"{t.size / 1e6:.1f} MB"
        files = f"{len(t.files)} file{'s' if len(t.files) != 1 else ''}"
        lines.append(f"{t.name}\n  {t.title}\n  format {t.format}; {files}, {size}; "
                     f"license {t.license}\n  from {t.source} (pinned commit)"
                     + (f"\n  {t.note}" if t.note else ""))
    return "\n".join(lines)

