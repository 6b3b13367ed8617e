"""How long a folder's creation takes on a file system, serially and from several threads (bench only; issue
11: the cache restore's profile on the device had 152 ``mkdir`` calls take 37-49 ms). Usage:
python bench/mkdir_probe.py DIR... ; for each DIR: N folders in 8 parents and in one parent, made by one
thread and by 8 threads, and as many empty files created, then all removed."""

import os
import shutil
import sys
import threading
import time

N = 800


def timed(make, paths, threads):
    """Seconds for ``threads`` threads to ``make`` every path (each thread every threads-th path)."""
    def work(part):
        for p in part:
            make(p)
    ts = [threading.Thread(target=work, args=(paths[i::threads],)) for i in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def empty_file(path):
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


for base in sys.argv[1:]:
    root = os.path.join(base, f"_mkdir_probe_{os.getpid()}")
    for rnd in range(2):
        for parents in (8, 1):
            for threads in (1, 8):
                shutil.rmtree(root, ignore_errors=True)
                for k in range(parents):
                    os.makedirs(os.path.join(root, f"p{k}"))
                os.sync()
                paths = [os.path.join(root, f"p{i % parents}", f"d{i}") for i in range(N)]
                t = timed(os.mkdir, paths, threads)
                fpaths = [os.path.join(root, f"p{i % parents}", f"f{i}") for i in range(N)]
                tf = timed(empty_file, fpaths, threads)
                print(f"{base} round {rnd + 1}: {N} mkdir in {parents} parent(s), {threads} thread(s): "
                      f"{t * 1000:.1f} ms ({t / N * 1e6:.0f} us each); {N} empty files: {tf * 1000:.1f} ms")
    shutil.rmtree(root, ignore_errors=True)
