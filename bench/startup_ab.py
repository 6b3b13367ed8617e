"""The start-up-bound commands of two envvault source trees, in the same rounds, beside their anchors (issue
11): a second snap of an unchanged venv, the quick ``status`` right after it, a ``--lock-only`` snap, the full
``status`` (the quick one turned off), ``diff`` of the environment against its snapshot and a compile cache restore, each run as ``python -m
envvault`` with ``PYTHONPATH`` set to one tree or the other, the trees alternating within each round, the rows
in turn; ``pip freeze``, ``uv pip freeze`` and ``zstd -dc | tar -x`` in the same rounds. Medians, and each
row's ratio to its anchor.

Usage: ``python bench/startup_ab.py VENV OLD_TREE [NEW_TREE] [ROUNDS]`` (NEW_TREE: this checkout; the
interpreter running this script runs envvault, uv from its folder or PATH; a PYTHONPATH set for this
script is kept after each tree's). The compile cache is a synthetic one of the H200 cache's shape, or with
``CACHE_TAR`` set, that archive's tree (a ``.tar.zst``, e.g. the H200 cache). Prints a table. On the
device: ``bench/gpu_startup_ab.sh``.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lean_ab import UNZSTD, UV, ZSTD, synthetic_cache  # noqa: E402


def main() -> None:
    venv = Path(sys.argv[1]).absolute()
    trees = {"old": Path(sys.argv[2]).absolute(),
             "new": Path(sys.argv[3]).absolute() if len(sys.argv) > 3 else Path(__file__).parents[1]}
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 9
    work = Path(tempfile.mkdtemp(prefix="startup-ab-"))
    cache, vault, dst = work / "cache", work / "vault", work / "dst"
    if os.environ.get("CACHE_TAR"):
        cache.mkdir(parents=True)
        subprocess.run(f"{sys.executable} -c '{UNZSTD}' < {os.environ['CACHE_TAR']} | tar -xf - -C {cache}",
                       shell=True, check=True)
    else:
        synthetic_cache(cache)
    base = dict(os.environ)
    base.pop("VIRTUAL_ENV", None)
    rest = os.environ.get("PYTHONPATH")  # (the dependencies' folder, on the device) stays after the tree
    # Each tree its own vault: a stat cache or verdict that another envvault version wrote is ignored, so
    # trees sharing one vault made each other's fast paths slow paths (0.8-2.7 s rows on the device).
    envs = {k: dict(base, ENVVAULT_HOME=f"{vault}-{k}", PYTHONPATH=str(t) + (os.pathsep + rest if rest else ""))
            for k, t in trees.items()}
    ev = [sys.executable, "-m", "envvault"]  # run in ``work``: -m puts the working folder first on sys.path
    for e in envs.values():
        subprocess.run(ev + ["snap", "--venv", venv, "--no-caches"], env=e, check=True,
                       stdout=subprocess.DEVNULL, cwd=work)
        subprocess.run(ev + ["cache", "snap", "--cache-dir", cache, "--no-discover"], env=e, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=work)
    subprocess.run(f"tar -cf - -C {cache} . | {sys.executable} -c '{ZSTD}' > {work}/cache.tar.zst", shell=True,
                   check=True)
    py = str(venv / "bin" / "python")
    anchors = {
        "pip freeze": ([py, "-m", "pip", "freeze"], base, None),
        "uv pip freeze": ([UV, "pip", "freeze", "--python", py], base, None),
        "zstd -dc | tar -x": (["bash", "-c", f"mkdir -p {dst} && {sys.executable} -c '{UNZSTD}' < {work}/cache.tar.zst"
                               f" | tar -x -C {dst}"], base, dst),
    }
    commands = {  # name: (arguments, anchor, extra environment, a folder emptied before each run)
        "second snap": (["snap", "--venv", venv], "pip freeze", {}, None),
        # right after a snap, which leaves the verdict the quick status answers from
        "status (quick)": (["status", "--venv", venv], "pip freeze", {}, None),
        "--lock-only snap": (["snap", "--venv", venv, "--lock-only"], "uv pip freeze", {}, None),
        "status (full)": (["status", "--venv", venv], "pip freeze", {"ENVVAULT_QUICK_STATUS": "0"}, None),
        "diff latest current": (["diff", "latest", "current", "--venv", venv], "pip freeze", {}, None),
        "cache restore": (["cache", "restore", "--to", dst], "zstd -dc | tar -x", {}, dst),
    }
    rows = dict(anchors)
    for name, (args, _, extra, empty) in commands.items():
        for tree in trees:
            rows[f"{name}, {tree}"] = (ev + args, dict(envs[tree], **extra), empty)
    times: dict = {k: [] for k in rows}
    for r in range(rounds):
        order = list(rows) if r % 2 == 0 else [k.replace(", old", ", tmp").replace(", new", ", old")
                                                .replace(", tmp", ", new") for k in rows]
        for name in order:
            cmd, e, empty = rows[name]
            if empty is not None:
                shutil.rmtree(empty, ignore_errors=True)
            t0 = time.perf_counter()
            subprocess.run(cmd, env=e, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=work)
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"# bench/startup_ab.py {venv} ({os.cpu_count()} cores), {rounds} rounds, medians; "
          f"old {trees['old']}, new {trees['new']}")
    print("| row | old (ms) | new (ms) | new / old | anchor | anchor (ms) | old ratio | new ratio |")
    print("| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for name, (_, anchor, _, _) in commands.items():
        old, new, a = med[f"{name}, old"], med[f"{name}, new"], med[anchor]
        print(f"| {name} | {old * 1000:.1f} | {new * 1000:.1f} | {new / old:.2f} | {anchor} | {a * 1000:.1f} "
              f"| {old / a:.2f}x | {new / a:.2f}x |")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
