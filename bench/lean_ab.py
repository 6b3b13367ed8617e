"""The lean commands against the same commands through click, beside their anchors, in the same rounds
(issue 11; envvault/lean.py): a second snap of an unchanged venv and a ``--lock-only`` snap (against ``pip
freeze`` and ``uv pip freeze``), and a compile cache restore (against ``zstd -dc | tar -x`` of the same files,
zstandard's own decompressor as on the device). Each row runs ``ROUNDS`` times, the rows in turn within a
round; medians, and the ratio of each to its anchor.

Usage: ``python bench/lean_ab.py VENV [CACHE_DIR] [ROUNDS]`` (envvault and uv from this interpreter's
folder; without CACHE_DIR a synthetic cache of 697 files and 46 MB in 152 folders is made). Prints a table.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
EV = str(BIN / "envvault")
UV = shutil.which("uv", path=str(BIN)) or "uv"
UNZSTD = "import sys, zstandard; zstandard.ZstdDecompressor().copy_stream(sys.stdin.buffer, sys.stdout.buffer)"
ZSTD = "import sys, zstandard; zstandard.ZstdCompressor(level=3, threads=-1).copy_stream(sys.stdin.buffer, sys.stdout.buffer)"


def synthetic_cache(root: Path) -> None:
    """697 files (2-200 KB, half of each compressible), 46 MB, in 152 folders: the shape of the H200 cache."""
    rng = random.Random(1)
    for d in range(152):
        folder = root / f"d{d:03d}" / ("sub" if d % 3 else "")
        folder.mkdir(parents=True, exist_ok=True)
        for f in range(4 if d < 63 else 5):
            size = rng.choice([2000, 8000, 60000, 200000])
            (folder / f"f{f}.py").write_bytes(rng.randbytes(size // 2) + bytes(size // 2))


def main() -> None:
    venv = Path(sys.argv[1]).absolute()
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 9
    work = Path(tempfile.mkdtemp(prefix="lean-ab-"))
    cache = Path(sys.argv[2]).absolute() if len(sys.argv) > 2 and sys.argv[2] else work / "cache"
    if not cache.exists():
        synthetic_cache(cache)
    vault, dst = work / "vault", work / "dst"
    env = dict(os.environ, ENVVAULT_HOME=str(vault))
    env.pop("VIRTUAL_ENV", None)
    subprocess.run([EV, "snap", "--venv", venv, "--no-caches"], env=env, check=True, stdout=subprocess.DEVNULL)
    subprocess.run([EV, "cache", "snap", "--cache-dir", cache, "--no-discover"], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run(f"tar -cf - -C {cache} . | {sys.executable} -c '{ZSTD}' > {work}/cache.tar.zst", shell=True,
                   check=True)
    full = dict(env, ENVVAULT_LEAN="0")
    py = str(venv / "bin" / "python")
    rows = {  # name: (command, environment, a folder emptied before each run)
        "pip freeze": ([py, "-m", "pip", "freeze"], env, None),
        "second snap, lean": ([EV, "snap", "--venv", venv], env, None),
        "second snap, click": ([EV, "snap", "--venv", venv], full, None),
        "uv pip freeze": ([UV, "pip", "freeze", "--python", py], env, None),
        "--lock-only, lean": ([EV, "snap", "--venv", venv, "--lock-only"], env, None),
        "--lock-only, click": ([EV, "snap", "--venv", venv, "--lock-only"], full, None),
        "zstd -dc | tar -x": (["bash", "-c", f"mkdir -p {dst} && {sys.executable} -c '{UNZSTD}' < {work}/cache.tar.zst"
                               f" | tar -x -C {dst}"], env, dst),
        "cache restore, lean": ([EV, "cache", "restore", "--to", dst], env, dst),
        "cache restore, click": ([EV, "cache", "restore", "--to", dst], full, dst),
    }
    times: dict = {k: [] for k in rows}
    for _ in range(rounds):
        for name, (cmd, e, empty) in rows.items():
            if empty is not None:
                shutil.rmtree(empty, ignore_errors=True)
            t0 = time.perf_counter()
            subprocess.run(cmd, env=e, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    anchors = {"second snap": "pip freeze", "--lock-only": "uv pip freeze", "cache restore": "zstd -dc | tar -x"}
    print(f"# bench/lean_ab.py {venv} ({os.cpu_count()} cores), {rounds} rounds, medians")
    print("| row | median (ms) | anchor | anchor (ms) | ratio |")
    print("| --- | ---: | --- | ---: | ---: |")
    for name, t in med.items():
        anchor = anchors.get(name.split(",")[0])
        if anchor is None:
            print(f"| {name} | {t * 1000:.1f} | | | |")
        else:
            print(f"| {name} | {t * 1000:.1f} | {anchor} | {med[anchor] * 1000:.1f} | {t / med[anchor]:.2f}x |")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
