"""Issue 6 figure: guard's overhead before the command starts, on an unchanged torch 2.13.0+cpu venv.

    python bench/bench_guard.py [--venv PATH] [--runs 3]

Anchor: what a careful person does by hand before an install, ``pip freeze`` (to know what they had) plus
the tool's own dry run (to see what would change). guard does both jobs (a snapshot instead of a freeze;
the same dry run, overlapped with the snapshot), so the goal is

    overhead <= dry_run + 0.3 x pip_freeze,   i.e.   (overhead - dry_run) / pip_freeze <= 0.3

The overhead is measured from launching ``envvault guard`` to the moment guard starts the command (the
``command_started_at`` it reports), so interpreter start-up, the snapshot, the plan and the consent
check are all in it. The command is a no-op install (``pip install --no-index torch``: already there).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Figure, ensure_torch_venv, envvault_cmd, ev_env, median, report, run, save, timed  # noqa: E402


def measure(venv: Path, runs: int = 3, requirement: str = "torch") -> dict:
    """Medians (and samples) in seconds of: pip freeze, the dry run guard asks for, and guard's overhead
    before the command starts; plus the ratios. ``requirement`` must already be installed in ``venv``."""
    if runs < 3:
        raise ValueError("take at least 3 runs: the figures are medians")
    venv = Path(venv).absolute()
    py = venv / "bin" / "python"
    env = dict(ev_env(), PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    work = Path(tempfile.mkdtemp(prefix="evbench-guard-"))
    command = [str(py), "-m", "pip", "install", "--no-index", requirement]
    try:
        vault = work / "vault"
        # Settle: the first snapshot of the venv stores everything; the figure is for an unchanged venv.
        run(envvault_cmd(vault, "snap", "--venv", venv, "--no-caches", "--json"), env=env)
        freeze, dry, overhead, snap, wait = [], [], [], [], []
        for i in range(runs):
            w, _ = timed([py, "-m", "pip", "freeze"], env=env)
            freeze.append(w)
            w, _ = timed([*command, "--dry-run", "--report", work / f"report{i}.json", "--progress-bar", "off"], env=env)
            dry.append(w)
            launched = time.time()
            proc = run(envvault_cmd(vault, "guard", "--json", "--yes", "--venv", venv, "--", *command), env=env)
            doc = json.loads(proc.stdout)
            if doc["outcome"] != "ran" or doc["plan"]["changes"]:
                raise RuntimeError(f"the guarded no-op did something else: {doc['outcome']}, {doc['plan']}")
            overhead.append(doc["timings"]["command_started_at"] - launched)
            snap.append(doc["timings"]["snapshot_before"])
            wait.append(doc["timings"]["plan_wait"])
        f, d, o = median(freeze), median(dry), median(overhead)
        result = {
            "venv": str(venv),
            "runs": runs,
            "pip_freeze_s": f,
            "dry_run_s": d,
            "guard_overhead_s": o,
            "snapshot_before_s": median(snap),
            "plan_wait_after_snapshot_s": median(wait),
            "excess_over_dry_run_per_freeze": (o - d) / f,  # the goal: <= 0.3
            "overhead_per_anchor": o / (f + d),
            "samples": {"pip_freeze": freeze, "dry_run": dry, "guard_overhead": overhead},
        }
        print(f"guard overhead {o:.3f} s = dry run {d:.3f} s + {o - d:+.3f} s; "
              f"pip freeze {f:.3f} s; (overhead - dry run) / pip freeze = {(o - d) / f:.2f}x (goal <= 0.3x); "
              f"overhead / (pip freeze + dry run) = {o / (f + d):.2f}x")
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def figures(result: dict) -> list[Figure]:
    """The table rows for ``measure``'s result."""
    f, d, o = result["pip_freeze_s"], result["dry_run_s"], result["guard_overhead_s"]
    return [
        Figure("guard, unchanged venv: overhead before the command (s)", o, "s", "pip freeze + the tool's dry run",
               f + d, "<= (dry run + 0.3 x freeze)", (d + 0.3 * f) / (f + d),
               notes=f"freeze {f:.3f} s, dry run {d:.3f} s; excess over the dry run = "
                     f"{result['excess_over_dry_run_per_freeze']:.2f}x pip freeze",
               samples=result["samples"]["guard_overhead"]),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--venv", type=Path)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    venv = ensure_torch_venv(args.venv)
    result = measure(venv, args.runs)
    figs = figures(result)
    report(figs, f"guard ({venv})")
    print(save(figs, "guard", {"guard": result}))


if __name__ == "__main__":
    main()
