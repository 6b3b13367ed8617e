"""Where a snap's threads spend their time: ``ENVVAULT_STAGES=1`` sums the seconds of each stage of the
ingest pipeline and prints them on stderr at exit (bench/gpu_stages.py reads them). Off, each stage costs
one check of ``ON``."""

from __future__ import annotations

import os
import threading
import time

__all__ = ["ON", "add", "clock", "clear", "encoded", "merge"]

ON = os.environ.get("ENVVAULT_STAGES") == "1"
_totals: dict[str, list] = {}
_lock = threading.Lock()
clock = time.perf_counter


def add(stage: str, since: float) -> None:
    """Add the seconds from ``since`` (a ``clock()`` reading) to ``stage``."""
    took = clock() - since
    with _lock:
        got = _totals.get(stage)
        if got is None:
            _totals[stage] = [took, 1]
        else:
            got[0] += took
            got[1] += 1


def clear() -> None:
    """Forget every stage's seconds (a forked child: what it inherited is its parent's to report)."""
    with _lock:
        _totals.clear()


def encoded() -> bytes:
    """Every stage's seconds and calls so far, as bytes for ``merge`` in another process."""
    import json

    with _lock:
        return json.dumps(_totals).encode()


def merge(data: bytes, prefix: str) -> None:
    """Add another process's ``encoded`` stages, each named with ``prefix``; anything malformed is ignored
    (the stages are a measurement, never a reason to fail)."""
    import json

    try:
        got = json.loads(data)
        items = [(prefix + str(k), float(v[0]), int(v[1])) for k, v in got.items()]
    except (ValueError, TypeError, AttributeError, IndexError, KeyError):
        return
    with _lock:
        for stage, secs, n in items:
            mine = _totals.setdefault(stage, [0.0, 0])
            mine[0] += secs
            mine[1] += n


def _report() -> None:
    import sys

    for stage, (secs, n) in sorted(_totals.items()):
        print(f"envvault-stage {stage}: {secs:.3f} s in {n} calls", file=sys.stderr)


if ON:
    import atexit

    atexit.register(_report)
