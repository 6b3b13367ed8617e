"""Two versions of envvault on the same machine in the same minutes: each figure alternately, median of N.

    python bench/ab_before_after.py OLD_CHECKOUT NEW_CHECKOUT TORCH_VENV [--runs 3]

Each checkout needs its own ``.venv`` with envvault installed (``python -m venv .venv && .venv/bin/pip
install -e .``) and compiled bytecode (``python -m compileall envvault``). TORCH_VENV is changed and put
back (its ``torch`` folder removed, its ``torch/lib/libtorch_cpu.so`` edited: each version restores them).
Prints one markdown row a figure: the old median, the new, their ratio. Used for issue 10's "no worse" table (bench/results/issue10_ab.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("venv", type=Path)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    codes = {"old": a.old.resolve(), "new": a.new.resolve()}
    venv = str(a.venv.resolve())
    site = next(Path(venv, "lib").glob("python3*/site-packages"))
    work = Path(tempfile.mkdtemp(prefix="evbench-ab-"))
    res: dict[str, dict[str, list[float]]] = {k: {} for k in codes}

    def ev(code: str, vault: Path, *args: str) -> tuple[float, str]:
        env = dict(os.environ, ENVVAULT_HOME=str(vault), PYTHONPATH=str(codes[code]))
        env.pop("VIRTUAL_ENV", None)
        t = time.perf_counter()
        p = subprocess.run([str(codes[code] / ".venv" / "bin" / "python"), "-m", "envvault", *args], env=env,
                           capture_output=True, text=True)
        if p.returncode not in (0, 1):
            sys.exit(f"{code}: envvault {' '.join(args)} exited {p.returncode}: {p.stderr[-500:]}")
        return time.perf_counter() - t, p.stdout

    def add(code: str, row: str, value: float) -> None:
        res[code].setdefault(row, []).append(value)

    try:
        for i in range(a.runs):
            for code in (("old", "new") if i % 2 == 0 else ("new", "old")):
                vault = work / code
                shutil.rmtree(vault, ignore_errors=True)
                dt, out = ev(code, vault, "snap", "--venv", venv, "--no-caches", "--json")
                sid = json.loads(out)["id"]
                add(code, "first full snap", dt)
                add(code, "second snap, unchanged", ev(code, vault, "snap", "--venv", venv, "--no-caches")[0])
                add(code, "status, unchanged", ev(code, vault, "status", "--venv", venv)[0])
                add(code, "--lock-only snap, first", ev(code, vault, "snap", "--lock-only", "--venv", venv,
                                                        "--no-caches")[0])
                add(code, "--lock-only snap, again", ev(code, vault, "snap", "--lock-only", "--venv", venv,
                                                        "--no-caches")[0])
                shutil.rmtree(site / "torch")
                add(code, "restore after rm -rf torch, --no-backup", ev(code, vault, "restore", sid, "--venv",
                                                                        venv, "--no-backup")[0])
                add(code, "status right after that restore", ev(code, vault, "status", "--venv", venv)[0])
                shutil.rmtree(site / "torch")
                add(code, "restore after rm -rf torch, default backup", ev(code, vault, "restore", sid, "--venv",
                                                                           venv)[0])
                # A backup that stores a pack: the edited 434 MB libtorch_cpu.so (its pack id hashed, then the
                # file written back by the restore).
                with open(site / "torch" / "lib" / "libtorch_cpu.so", "r+b") as f:
                    f.seek(1 << 20)
                    f.write(os.urandom(4096))
                add(code, "restore after editing libtorch_cpu.so, default backup",
                    ev(code, vault, "restore", sid, "--venv", venv)[0])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("| figure | old (s) | new (s) | new / old |\n| --- | ---: | ---: | ---: |")
    for row in res["old"]:
        o, n = statistics.median(res["old"][row]), statistics.median(res["new"][row])
        print(f"| {row} | {o:.3f} | {n:.3f} | {n / o:.2f}x |")


if __name__ == "__main__":
    main()
