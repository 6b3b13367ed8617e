"""envvault with the pack writer's in-flight bounds changed (bench only: bench/gpu_tuning.sh). The
environment variable TUNE is "BYTES_MIB:FRAMES_A_WORKER" (empty: the defaults) and MMAP_KIB the mmap
threshold a snap pins glibc's malloc at while it stores (envvault: 256), ARENA_MAX glibc's M_ARENA_MAX, GC
Python's cyclic garbage collector ("off": disabled for the whole command; a number: the first generation's
threshold); the rest of argv is envvault's. Peak RSS is printed on stderr at exit."""

import atexit
import os
import resource
import sys

tune = os.environ.get("TUNE", "")
if tune:
    import envvault.vault.packs as packs

    mib, a_worker = tune.split(":")
    packs._IN_FLIGHT_BYTES = int(mib) << 20
    packs.PackWriter._in_flight_a_worker = int(a_worker)
mmap_kib = os.environ.get("MMAP_KIB", "")
if mmap_kib:
    import envvault.vault.ingest as ingest

    def _steady_malloc() -> None:
        if ingest._MALLOC is None:
            ingest._MALLOC = ingest._mallopt((ingest._M_MMAP_THRESHOLD, int(mmap_kib) << 10))

    ingest._steady_malloc = _steady_malloc
arena_max = os.environ.get("ARENA_MAX", "")
if arena_max:
    import envvault.vault.ingest as ingest

    ingest._mallopt((-8, int(arena_max)))  # M_ARENA_MAX
gc_setting = os.environ.get("GC", "")
if gc_setting:
    import gc

    if gc_setting == "off":
        gc.disable()
    else:
        gc.set_threshold(int(gc_setting), *gc.get_threshold()[1:])
atexit.register(lambda: print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MB, "
                              f"largest child's: {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024} MB",
                              file=sys.stderr))
sys.argv[0] = "envvault"
from envvault.entry import main  # noqa: E402

main()
