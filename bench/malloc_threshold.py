"""Why a snap gives glibc's mmap threshold back when its ingest ends (``vault/ingest.py``, ``_relax_malloc``):
1 MiB zstd frames decompressed on 2 threads with the threshold as glibc sets it (``none``), pinned at 256 KiB
as a storing snap pins it (``pin``), and pinned then relaxed (``relax``). Prints seconds for each.

    python bench/malloc_threshold.py
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
import time


def run(mode: str) -> float:
    import zstandard

    libc = ctypes.CDLL(None)
    if mode in ("pin", "relax"):
        libc.mallopt(-3, 256 << 10)  # M_MMAP_THRESHOLD
    if mode == "relax":
        libc.mallopt(-3, 8 << 20)
        libc.mallopt(-1, 16 << 20)  # M_TRIM_THRESHOLD
    data = os.urandom(1 << 19) + bytes(1 << 19)
    frames = [zstandard.ZstdCompressor(level=3, write_content_size=True).compress(bytes([i]) + data) for i in range(8)]

    def work():
        d = zstandard.ZstdDecompressor()
        for i in range(600):
            d.decompress(frames[i % 8])

    t = time.perf_counter()
    threads = [threading.Thread(target=work) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.perf_counter() - t


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(f"{run(sys.argv[1]):.3f}")
    else:
        for mode in ("none", "pin", "relax") * 2:  # each in a fresh process: mallopt is for the process
            out = subprocess.run([sys.executable, __file__, mode], capture_output=True, text=True, check=True)
            print(f"{mode:6s} {out.stdout.strip()} s")
