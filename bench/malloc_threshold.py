"""glibc's mmap and trim thresholds against the pack writer's and a restore's buffers (``vault/ingest.py``
``_steady_malloc`` / ``_relax_malloc``, ``vault/packs.py`` ``_Compressed``), 2 threads, each mode in a fresh
process (mallopt is for the process):

- decompress 1 MiB frames: thresholds as glibc sets them (``none``), the mmap threshold pinned at 256 KiB as a
  storing snap pins it (``pin``), pinned then given back (``relax``, what a restore after its backup snap gets);
- compress 4 MiB chunks one-shot (``one``: a buffer of the frame's bound each) or streamed into 128 KiB pieces
  (``stream``), unpinned, pinned, and pinned with a 4 MiB trim threshold (``pin+trim4``, what a snap uses).

    python bench/malloc_threshold.py
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
import time

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


class _Pieces:
    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, b: bytes) -> int:
        self.parts.append(b)
        return len(b)


def run(work: str, how: str, malloc: str) -> float:
    import zstandard

    libc = ctypes.CDLL(None)
    if malloc.startswith("pin"):
        libc.mallopt(M_MMAP_THRESHOLD, 256 << 10)
    if malloc == "pin+trim4":
        libc.mallopt(M_TRIM_THRESHOLD, 4 << 20)
    if malloc == "relax":
        libc.mallopt(M_MMAP_THRESHOLD, 256 << 10)
        libc.mallopt(M_MMAP_THRESHOLD, 8 << 20)
        libc.mallopt(M_TRIM_THRESHOLD, 16 << 20)
    if work == "decompress":
        data = os.urandom(1 << 19) + bytes(1 << 19)
        frames = [zstandard.ZstdCompressor(level=3, write_content_size=True).compress(bytes([i]) + data)
                  for i in range(8)]

        def one_thread():
            d = zstandard.ZstdDecompressor()
            for i in range(600):
                d.decompress(frames[i % 8])
    else:
        chunks = [bytes([i]) + os.urandom(3 << 19) + bytes(5 << 19) for i in range(4)]

        def one_thread():
            c = zstandard.ZstdCompressor(level=2, write_content_size=True)
            for i in range(150):
                raw = chunks[i % 4]
                if how == "one":
                    c.compress(raw)
                else:
                    w = c.stream_writer(_Pieces(), size=len(raw), write_size=128 << 10, closefd=False)
                    w.write(raw)
                    w.flush(zstandard.FLUSH_FRAME)

    t = time.perf_counter()
    threads = [threading.Thread(target=one_thread) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.perf_counter() - t


MODES = [("decompress", "-", m) for m in ("none", "pin", "relax")] + \
    [("compress", how, m) for how in ("one", "stream") for m in ("none", "pin", "pin+trim4")]

if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(f"{run(*sys.argv[1:4]):.3f}")
    else:
        for mode in MODES:
            got = [subprocess.run([sys.executable, __file__, *mode], capture_output=True, text=True,
                                  check=True).stdout.strip() for _ in range(2)]
            print(f"{' '.join(mode):28s} {' '.join(got)} s")
