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


def made(paths, threads):
    def work(part):
        for p in part:
            os.mkdir(p)
    parts = [paths[i::threads] for i in range(threads)]
    t0 = time.perf_counter()
    ts = [threading.Thread(target=work, args=(p,)) for p in parts]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def files(paths, threads):
    def work(part):
        for p in part:
            os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    parts = [paths[i::threads] for i in range(threads)]
    t0 = time.perf_counter()
    ts = [threading.Thread(target=work, args=(p,)) for p in parts]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


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
                t = made(paths, threads)
                fpaths = [os.path.join(root, f"p{i % parents}", f"f{i}") for i in range(N)]
                tf = files(fpaths, threads)
                print(f"{base} round {rnd + 1}: {N} mkdir in {parents} parent(s), {threads} thread(s): "
                      f"{t * 1000:.1f} ms ({t / N * 1e6:.0f} us each); {N} empty files: {tf * 1000:.1f} ms")
    shutil.rmtree(root, ignore_errors=True)
