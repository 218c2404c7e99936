"""Where trace bytes come from: a file (plain, gzip or zstd, told apart by
their first bytes, not their names), ``"-"`` for standard input, or an open
binary file object. Decompression errors become ``SourceError`` (a
``ValueError``) naming the source.

>>> import gzip, io
>>> src = Source(io.BytesIO(gzip.compress(b"[1, 2]\\n")))
>>> with src.open() as f:
...     f.read()
b'[1, 2]\\n'
>>> src.compression, src.name
('gzip', 'stream')
"""

import gzip
import io
import os
import sys
import zlib
from pathlib import Path

__all__ = ["Source", "SourceError", "as_source", "STDIN", "COMPRESSED_SUFFIXES"]

#: The path that means standard input.
STDIN = "-"
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: File name endings stripped from a trace's name (``conv.jsonl.gz`` -> ``conv``).
COMPRESSED_SUFFIXES = (".gz", ".zst", ".zstd")


class SourceError(ValueError):
    """A source that cannot be read as announced (corrupt compression, a
    missing optional decompressor)."""


def _zstandard():
    try:
        import zstandard
    except ImportError:
        raise SourceError("this trace is zstd-compressed: reading it needs the 'zstandard' "
                          "module (pip install zstandard), or decompress it first "
                          "(zstd -d)") from None
    return zstandard


class Source:
    """One trace input. ``name`` is what messages show, ``stem`` the trace's
    name (file name without ``.jsonl``/``.json`` and compression suffixes).
    Standard input and file objects are read once into memory, so a source
    can be opened several times (format detection peeks, then loads)."""

    def __init__(self, src, progress=None):
        self._bytes = None
        #: ``progress(bytes read, total bytes)`` as a file is read (the
        #: undecoded bytes, so compressed files report true progress)
        self.progress = progress
        self.path = None
        if isinstance(src, (str, os.PathLike)) and os.fspath(src) == STDIN:
            self.name, self.stem = "<stdin>", "stdin"
            self._stream = sys.stdin.buffer
        elif isinstance(src, (str, os.PathLike)):
            self.path = Path(os.fspath(src))
            self.name = str(self.path)
            stem = self.path.name
            for suffix in COMPRESSED_SUFFIXES:
                if stem.endswith(suffix):
                    stem = stem[: -len(suffix)]
                    break
            self.stem = Path(stem).stem
            self._stream = None
        elif hasattr(src, "read"):
            name = getattr(src, "name", None)
            self.name = str(name) if isinstance(name, str) else "stream"
            self.stem = Path(self.name).stem if isinstance(name, str) else "stream"
            self._stream = src
        else:
            raise TypeError(f"a trace source must be a path, '-' or a binary file object, "
                            f"got {type(src).__name__}")
        self.compression = None

    def _raw(self):
        """A fresh binary file object over the undecoded bytes."""
        if self.path is not None:
            if not self.path.exists():
                raise FileNotFoundError(f"trace file not found: {self.path}")
            if self.path.is_dir():
                raise IsADirectoryError(f"trace path is a directory: {self.path}")
            f = open(self.path, "rb")
            if self.progress is None:
                return f
            return io.BufferedReader(_Counting(f, os.fstat(f.fileno()).st_size, self.progress),
                                     1 << 16)
        if self._bytes is None:
            data = self._stream.read()
            if isinstance(data, str):
                raise TypeError("a trace stream must be opened in binary mode")
            self._bytes = bytes(data)
        return io.BytesIO(self._bytes)

    def open(self):
        """A binary file object of the decompressed content."""
        raw = self._raw()
        head = raw.read(4)
        raw.seek(0)
        if head[:2] == GZIP_MAGIC:
            self.compression = "gzip"
            return io.BufferedReader(_Checked(gzip.GzipFile(fileobj=raw), self.name, "gzip"),
                                     1 << 16)
        if head == ZSTD_MAGIC:
            self.compression = "zstd"
            try:
                zstd = _zstandard()
            except SourceError:
                raw.close()
                raise
            reader = zstd.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
            return io.BufferedReader(_Checked(reader, self.name, "zstd", zstd.ZstdError),
                                     1 << 16)
        return raw

    def read(self):
        """The whole decompressed content as bytes."""
        with self.open() as f:
            return f.read()

    def head(self, n=1 << 16):
        """Up to ``n`` decompressed bytes from the start."""
        with self.open() as f:
            return f.read(n)


class _Counting(io.RawIOBase):
    """A file that reports how much of it has been read."""

    def __init__(self, f, total, report):
        self._f, self._total, self._report, self._done = f, total, report, 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, pos, whence=0):
        self._done = self._f.seek(pos, whence)
        return self._done

    def readinto(self, b):
        n = self._f.readinto(b)
        if n:
            self._done += n
            self._report(self._done, self._total)
        return n

    def close(self):
        self._f.close()
        super().close()


def as_source(src):
    """``src`` as a ``Source`` (a ``Source`` as is)."""
    return src if isinstance(src, Source) else Source(src)


class _Checked(io.RawIOBase):
    """A decompressing reader whose errors name the source."""

    def __init__(self, inner, name, kind, *errors):
        self._inner, self._name, self._kind = inner, name, kind
        self._errors = (OSError, EOFError, zlib.error, *errors)

    def readable(self):
        return True

    def readinto(self, b):
        try:
            data = self._inner.read(len(b))
        except self._errors as e:
            raise SourceError(f"{self._name}: corrupt {self._kind} data ({e})") from None
        b[:len(data)] = data
        return len(data)

    def close(self):
        self._inner.close()
        super().close()
