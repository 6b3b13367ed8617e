"""Rendering for the CLI: one JSON document on stdout, or text for people; progress on stderr.

Library code never prints: it returns results and, for long work, calls a ``progress`` callable.
"""

from __future__ import annotations

import json
import os
import sys
import time
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Any, Protocol
else:
    from envvault.runtime_types import Protocol

__all__ = ["emit_json", "echo", "use_colour", "style", "printable", "Progress", "ProgressSink", "human_bytes"]


def emit_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")


_ANSI = None


def echo(text: str, err: bool = False) -> None:
    """One line on stdout (stderr with ``err``), as ``click.echo`` prints it: styles removed where the stream
    is not a terminal (whatever FORCE_COLOR says), flushed. The commands that run without click print with it."""
    global _ANSI
    stream = sys.stderr if err else sys.stdout
    if stream is None:
        return
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError, OSError):
        tty = False
    if not tty and "\x1b" in text:
        if _ANSI is None:
            import re

            _ANSI = re.compile(r"\x1b\[[;?0-9]*[a-zA-Z]")  # click's own
        text = _ANSI.sub("", text)
    try:
        stream.write(text + "\n")
    except UnicodeEncodeError:
        import codecs

        buffer = getattr(stream, "buffer", None)
        if buffer is None or codecs.lookup(stream.encoding or "utf-8").name != "ascii":
            raise
        stream.flush()  # an ASCII stream is a misconfigured one: click writes UTF-8 to it, as here
        buffer.write((text + "\n").encode("utf-8", "replace"))
    stream.flush()


def use_colour(stream=None) -> bool:
    stream = stream or sys.stdout
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return hasattr(stream, "isatty") and stream.isatty()


_CODES = {"red": 31, "green": 32, "yellow": 33, "blue": 34, "magenta": 35, "cyan": 36, "bold": 1, "dim": 2}


def printable(text: str) -> str:
    """``text`` with control characters escaped (``\\n``, ``\\x1b``): a name from a stranger's file, or a file
    name with a newline in it, printed as one line that a terminal does not obey."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


def style(text: str, colour: str, enabled: bool | None = None) -> str:
    if enabled is None:
        enabled = use_colour()
    if not enabled:
        return text
    return f"\x1b[{_CODES[colour]}m{text}\x1b[0m"


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class ProgressSink(Protocol):
    """Where long library work (a snap's scan, a restore, a cache restore) reports: the amount to expect
    once it is known (``set_total``), then the amount done (``sink(done)``). ``Progress`` is one."""

    def set_total(self, total: int) -> None: ...

    def __call__(self, done: int) -> None: ...


class Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a TTY and enabled.

    Usage: ``p = Progress("snap", total_bytes, enabled=...)``; ``p(done_bytes)``; ``p.close()``.
    It is a ``ProgressSink``, which is what library code takes.
    """

    def __init__(self, label: str, total: int, *, enabled: bool = True, unit: str = "bytes") -> None:
        self.label = label
        self.total = max(total, 1)
        self.unit = unit
        self.enabled = enabled and sys.stderr.isatty()
        self._last = 0.0
        self.done = 0

    def set_total(self, total: int) -> None:
        self.total = max(total, 1)

    def __call__(self, done: int) -> None:
        self.done = done
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < 0.1 and done < self.total:
            return
        self._last = now
        frac = min(done / self.total, 1.0)
        width = 30
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        if self.unit == "bytes":
            amount = f"{human_bytes(done)}/{human_bytes(self.total)}"
        else:
            amount = f"{done}/{self.total}"
        self._draw(f"\r{self.label} [{bar}] {frac * 100:5.1f}% {amount}  ")

    def close(self) -> None:
        if self.enabled:
            self._draw("\r" + " " * 79 + "\r")

    def _draw(self, text: str) -> None:
        """Write ``text`` to the terminal; one that fails (EIO: the terminal hung up, before the SIGHUP that
        ``terminate.hung_up`` handles arrives; a closed stderr) ends the bar, never the work it shows."""
        try:
            sys.stderr.write(text)
            sys.stderr.flush()
        except (OSError, ValueError):
            self.enabled = False

