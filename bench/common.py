"""Shared benchmark machinery: run a command, time it, take medians, report figures beside anchors.

Figures live here, not in timed tests. Each figure is measured in the same run as its anchor, and the
ratio is what we judge (machines here are shared and noisy).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import stat
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"


@dataclass
class Figure:
    """One row of the table: our number, the anchor's, the ratio, and the goal."""

    name: str
    value: float
    unit: str
    anchor_name: str = ""
    anchor: float | None = None
    goal: str = ""  # e.g. "<= 1.0x", "<= 64 KiB"
    limit: float | None = None  # the number `ratio` (or `value` when no anchor) must not exceed
    notes: str = ""
    samples: list = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        if self.anchor in (None, 0):
            return None
        return self.value / self.anchor

    @property
    def ok(self) -> bool | None:
        if self.limit is None:
            return None
        measured = self.ratio if self.anchor is not None else self.value
        return measured is not None and measured <= self.limit

    def to_json(self) -> dict:
        d = asdict(self)
        d["ratio"] = self.ratio
        d["ok"] = self.ok
        return d


def run(cmd, *, env=None, cwd=None, check=True, capture=True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd] if isinstance(cmd, (list, tuple)) else cmd,
                          shell=isinstance(cmd, str), env=env, cwd=cwd, capture_output=capture, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{cmd} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc


def timed(cmd, **kw) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = run(cmd, **kw)
    return time.perf_counter() - t0, proc


def timed_rss(cmd, **kw) -> tuple[float, int, subprocess.CompletedProcess]:
    """Wall seconds and peak RSS in bytes of one command (GNU time's %M)."""
    rss_file = OUT / ".rss"
    OUT.mkdir(parents=True, exist_ok=True)
    full = ["/usr/bin/time", "-o", str(rss_file), "-f", "%M", *[str(c) for c in cmd]]
    t0 = time.perf_counter()
    proc = run(full, **kw)
    wall = time.perf_counter() - t0
    rss = int(rss_file.read_text().strip().splitlines()[-1]) * 1024
    return wall, rss, proc


def median(xs):
    return statistics.median(xs)


def drop_dirty() -> None:
    """Flush dirty pages so one measurement does not pay for the writes of the one before."""
    os.sync()


def retire(tree: Path, graveyard: Path) -> None:
    """Put a finished tree away without freeing an inode before the next timed run: its files emptied (their
    blocks freed) and the folder moved under ``graveyard``, which the caller removes once its rounds are done.
    This machine's ext4, like the GPU host's, has no journal (``/sys/fs/ext4/*/journal_task``: ``<none>``); there
    the kernel skips every inode freed in the last minutes when it picks one for a new file, scanning past them
    on every create, so a tree removed just before a timed run slows whatever runs next
    (bench/results/issue11_device.md, twenty-fourth session). A file with other names (uv links its cache's
    files into the venvs it makes) is left whole: emptying it would empty them too."""
    if not tree.exists():
        return
    for folder, _dirs, files in os.walk(tree):
        for name in files:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                os.truncate(path, 0)
    graveyard.mkdir(parents=True, exist_ok=True)
    tree.rename(graveyard / f"{tree.name}-{time.monotonic_ns()}")


def du(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def envvault_cmd(vault: Path, *args) -> list[str]:
    return [sys.executable, "-m", "envvault", "--vault", str(vault), *map(str, args)]


def ev_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    env.pop("VIRTUAL_ENV", None)
    return env


def machine() -> dict:
    try:
        model = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
    except OSError:
        model = ""
    try:
        mem = next(int(ln.split()[1]) for ln in open("/proc/meminfo") if ln.startswith("MemTotal")) * 1024
    except (OSError, StopIteration):
        mem = 0
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gib": round(mem / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "zstd": run(["zstd", "--version"], check=False).stdout.strip() if shutil.which("zstd") else None,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def ensure_torch_venv(path: Path | None) -> Path:
    """The benchmark venv: torch 2.13.0+cpu and numpy, installed by pip from this machine's disk."""
    if path:
        return Path(path)
    venv = OUT / "torchvenv"
    if not (venv / "bin" / "python").exists():
        run([sys.executable, "-m", "venv", str(venv)])
        run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "torch==2.13.0", "numpy"])
    return venv


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def report(figures: list[Figure], title: str) -> None:
    print(f"\n## {title}")
    print(f"{'figure':<58} {'value':>12} {'anchor':>12} {'ratio':>7}  goal")
    for f in figures:
        anchor = "" if f.anchor is None else f"{f.anchor:.3f}"
        ratio = "" if f.ratio is None else f"{f.ratio:.2f}x"
        mark = {True: "ok", False: "MISS", None: ""}[f.ok]
        print(f"{f.name:<58} {f.value:>12.3f} {anchor:>12} {ratio:>7}  {f.goal} {mark}")


def save(figures: list[Figure], name: str, extra: dict | None = None) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), "figures": [f.to_json() for f in figures], **(extra or {})},
                               indent=1))
    return path


def bench_main(measure, name: str, title: str) -> None:
    """The command line every venv benchmark shares: ``--venv PATH --runs N``, a table, bench/out/<name>.json."""
    import argparse

    ap = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__)
    ap.add_argument("--venv", type=Path)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    venv = ensure_torch_venv(args.venv)
    figs = measure(venv, args.runs)
    report(figs, f"{title} ({venv})")
    print(save(figs, name))
