"""Where a snap's threads spend their time: ``ENVVAULT_STAGES=1`` sums the seconds of each stage of the
ingest pipeline and prints them on stderr at exit (bench/gpu_stages.py reads them). Off, each stage costs
one check of ``ON``."""

from __future__ import annotations

import os
import threading
import time

__all__ = ["ON", "add", "clock"]

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


def _report() -> None:
    import sys

    for stage, (secs, n) in sorted(_totals.items()):
        print(f"envvault-stage {stage}: {secs:.3f} s in {n} calls", file=sys.stderr)


if ON:
    import atexit

    atexit.register(_report)
