"""Progress on stderr: replays done, bytes of a trace read, and the
one line said before kernels compile."""

import sys
import threading

from .args import PROG


class Progress:
    """Replays done, on stderr: a tqdm bar if tqdm is installed, else a
    plain counter. ``set(k)`` is thread-safe (sweep calls it from workers)."""

    def __init__(self, total, enabled):
        self.total, self.enabled, self.done = total, enabled, 0
        self._lock = threading.Lock()
        self._bar = None
        if not enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            self._draw()
        else:
            self._bar = tqdm(total=total, desc=f"{PROG}: replays", unit="replay",
                             file=sys.stderr, leave=False, dynamic_ncols=True)

    def _draw(self):
        sys.stderr.write(f"\r{PROG}: replay {self.done}/{self.total}")
        sys.stderr.flush()

    def set_total(self, total):
        self.total = total
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def set(self, done):
        if not self.enabled:
            return
        with self._lock:
            if done <= self.done:
                return
            step, self.done = done - self.done, done
            if self._bar is not None:
                self._bar.update(step)
            else:
                self._draw()

    def close(self):
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        else:
            sys.stderr.write("\r" + " " * (len(PROG) + 32) + "\r")
            sys.stderr.flush()


class LoadProgress:
    """Bytes of a trace file read, on stderr (tqdm, else a percentage)."""

    def __init__(self, enabled):
        self.enabled, self._bar, self._shown = enabled, None, -1

    def update(self, done, total):
        if not self.enabled or not total:
            return
        if self._bar is None and self._shown < 0:
            try:
                from tqdm import tqdm
            except ImportError:
                self._bar = False
            else:
                self._bar = tqdm(total=total, desc=f"{PROG}: loading", unit="B",
                                 unit_scale=True, file=sys.stderr, leave=False,
                                 dynamic_ncols=True)
            self._shown = 0
        if self._bar:
            self._bar.update(max(0, done - self._bar.n))
            return
        pct = min(100, done * 100 // total)
        if pct != self._shown:
            self._shown = pct
            sys.stderr.write(f"\r{PROG}: loading {pct}%")
            sys.stderr.flush()

    def close(self):
        if self._bar:
            self._bar.close()
        elif self._shown >= 0:
            sys.stderr.write("\r" + " " * (len(PROG) + 16) + "\r")
            sys.stderr.flush()


def progress_enabled(flag):
    if flag is not None:
        return flag
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
