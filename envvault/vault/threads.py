"""How many threads each stage of the ingest pipeline gets (``vault/ingest.py``'s readers and namers,
``vault/packs.py``'s compressors), and the materializer's writers (``materialize.py``): sized from the
cores this process may run on (``usable_cores``), each overridable by its variable (docs/cli.md, "Threads
and where they wait"). The vault's bytes do not depend on any of them."""

from __future__ import annotations

import gc
import os
import sys
from contextlib import contextmanager
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Iterator

__all__ = [
    "busy_threads", "usable_cores", "default_readers", "default_namers", "default_compressors", "default_writers", "default_restorers",
    "default_group_processes", "env_count",
]


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (a container started with ``--cpuset-cpus``, a job
    pinned by ``taskset`` or a cluster's scheduler), not the host's count, which ``os.cpu_count`` gives (128 on
    a large host where the job may use 4). The one rule every thread and child count here starts from. (A CPU
    quota without an affinity, ``docker --cpus``, is not seen: the ``ENVVAULT_*`` variables below set those.)"""
    count = getattr(os, "process_cpu_count", None)  # Python 3.13: the affinity, where the OS has one
    if count is not None:
        return count() or 1
    if hasattr(os, "sched_getaffinity"):
        try:
            return len(os.sched_getaffinity(0)) or 1
        except OSError:
            pass
    return os.cpu_count() or 1


@contextmanager
def busy_threads() -> Iterator[None]:
    """While many threads share the work (the ingest pipeline, the materializer's writers): the GIL's switch
    interval at ``SWITCH_INTERVAL`` at most, and Python's cyclic garbage collector off; both as they were
    after. A thread back from a system call (each ``open``, ``write``, ``close`` of a file) waits for the GIL
    until its holder gives it up, and one busy in Python keeps it up to the interval (Python's default: 5 ms).
    A collection holds the GIL (a full one walks every record alive, tens of ms) and so stops every thread at
    once, while these stages make no garbage that only it could free (peak RSS the same with it off). First
    snaps of the GPU host's venv, 3 rounds: 8.17 s against 8.51 s with the collector off
    (bench/results/gpu_tuning_gc_72d3365.txt)."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, SWITCH_INTERVAL))
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        sys.setswitchinterval(interval)
        if collecting:
            gc.enable()


SWITCH_INTERVAL = 0.0005  # seconds (Python's default is 5 ms)


def env_count(var: str, least: int, most: int, default: int) -> int:
    """``$var`` as a count from ``least`` up (at most ``most``), else ``default``: the one rule for every
    ``ENVVAULT_*`` count a user may set (a value that is not a whole number, or below ``least``, is ignored)."""
    try:
        given = int(os.environ.get(var, ""))
    except ValueError:
        return default
    return min(given, most) if given >= least else default


def default_readers() -> int:
    """Reader threads: 2 on 8 cores or more, else 1 (``ENVVAULT_READERS`` overrides it). The readers take
    the small files in order; the large ones are cut and named ahead by the namers (``default_namers``).
    Measured on the 16-core device (7.3 GB venv, 6 namers, 2026-12-01): 2 readers 10.2 s, 4: 11.0 s; below
    8 cores the pack writer's compressors want the cores (2 cores, torch venv: a first snap 10-15% slower
    with a second reader). See docs/benchmarks.md."""
    return env_count("ENVVAULT_READERS", 1, 64, 2 if usable_cores() >= 8 else 1)


def default_namers() -> int:
    """Namer threads (``_NameAhead``): on 8 cores or more, 3 in 8 of the cores, 3 to 6 (``ENVVAULT_NAMERS``
    overrides it; 0 turns naming ahead off); below 8 cores none. Each holds one ``WINDOW`` of a file.
    16-core device, 2 readers: no namers 14.1 s, 4: 11.3 s, 6: 10.2 s, 8: 10.2 s."""
    cores = usable_cores()
    return env_count("ENVVAULT_NAMERS", 0, 64, max(3, min(6, cores * 3 // 8)) if cores >= 8 else 0)


def default_compressors() -> int:
    """Compressor threads: every core below 8 cores (at least 2); from 8 cores on, half of them, at most 16
    (the namers and readers of ``vault/ingest.py`` want the rest, and each holds a buffer of up to 4 MiB);
    ``ENVVAULT_COMPRESSORS`` overrides it. 16-core device, 7.3 GB venv (2026-12-01): 8 compressors
    11.3 s / 290 MB, 12: 11.1-11.8 s / 322 MB, 16: 11.7 s / 345 MB."""
    cores = usable_cores()
    return env_count("ENVVAULT_COMPRESSORS", 1, 256, max(2, min(16, cores // 2) if cores >= 8 else cores))


def default_writers() -> int:
    """Writer threads of the pack writer (frames written with ``pwrite`` at the place the pack thread gave
    them): 1 (``ENVVAULT_WRITERS`` overrides it). Measured on the 16-core device (7.3 GB venv, 2026-12-01,
    bench/results/gpu_stages_8.json): 1 writer 11.1 s, 4 writers 12.7 s (their writes took 9.4 s in all
    against 1.6 s: they contend); the pack thread writing every frame itself, before, spent 5.2 s on it."""
    return env_count("ENVVAULT_WRITERS", 1, 64, 1)


def default_restorers() -> int:
    """Threads that write files out of the vault (``materialize.stage``: restores, ``--into``, the compile
    cache restore; ``export``'s wheel builders): one a core, up to 8 (``ENVVAULT_RESTORERS`` overrides it).
    Creating files waits on the filesystem's metadata as much as on a core; on 2 cores 4 threads were no
    faster than 2 under load. Measured on the 16-core device (``restore --into`` of the 7.3 GB venv, 2026-12-05,
    bench/results/gpu_into_threads_11fa550.txt): 4 threads 15.96 s, 8: 10.86-13.98 s, 16: 15.94-20.76 s."""
    return env_count("ENVVAULT_RESTORERS", 1, 64, max(1, min(8, usable_cores())))


def default_write_processes() -> int:
    """Forked processes that write files out of a vault in a folder (``materialize.stage``: a restore in place
    or ``--into``, a compile cache restore), each on one thread, in place of ``default_restorers``' threads of
    one process: 49,405 files each take the GIL for their Python work, behind the other threads. On 8 cores or
    more, one a core up to 16; below that, 1 (the threads of one process). ``ENVVAULT_WRITE_PROCESSES``
    overrides it (1: threads). Measured on the 16-core device (``restore --into`` of the 7.3 GB venv,
    2026-12-06, bench/results/gpu_into_fair_procs_*.txt): 8 threads 8.36-11.72 s, 8 processes 6.44-7.70 s,
    16 processes 5.92-6.65 s, uv's install 5.14-6.60 s."""
    cores = usable_cores()
    return env_count("ENVVAULT_WRITE_PROCESSES", 1, 64, min(16, cores) if cores >= 8 else 1)


def default_group_processes() -> int:
    """Forked processes that build a first snap's groups of small files before the pipeline
    (``snap/groups.py``): on 8 cores or more, half of them, at most 8 (16-core device: 4 were slower than 8);
    on 2 to 7 cores, 2 (2 cores, first snaps of the torch venv and a Python 3.10 venv, 3 rounds: 0.93x and
    0.94x of one process's time, peak RSS 121-126 MB against 153-158 MB); on one core, 1: none forked, each
    group built by the reader that first reaches it. The groups, and so the packs, are the same either way.
    ``ENVVAULT_GROUP_PROCESSES`` overrides it."""
    cores = usable_cores()
    return env_count("ENVVAULT_GROUP_PROCESSES", 1, 64, min(8, cores // 2) if cores >= 8 else min(2, cores))
