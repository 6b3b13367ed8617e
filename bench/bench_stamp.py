"""Issue 5 figures: what checkpoint stamping costs a training process, and what reading a checkpoint costs.

    python bench/bench_stamp.py [--venv PATH] [--runs 15] [--json]

- stamp overhead per torch.save after the first, 100 MB checkpoints (a dict, and a bare state_dict that
  gets the zip record), in one process after its first stamp: the wrapper's own work per save (median of
  200 calls; judged: <= 5 ms + 2% of the plain save, as the ratio overhead / save <= (5 ms + 2% save) /
  save), and as a cross-check the median of paired, alternating stamped-minus-plain whole saves (os.sync
  before each; shown, not judged: on a shared machine pairs of 100 MB saves scatter by tens of ms);
- the first stamp in a fresh process whose environment is already vaulted (a full `envvault snap` of the
  venv, nothing else): enable() + the first save, minus a plain save; goal <= 300 ms; anchor: that
  process's own `import torch`;
- `envvault inspect --json` of 1 GB checkpoints (a zip with 1000 tensors and optimizer state; legacy),
  whole process: goal <= 1 s wall and <= 100 MB peak RSS; anchor: a fresh process doing
  `torch.load(weights_only=True)` of the same file (with mmap=True for the zip; legacy files cannot mmap);
- start-up of the venv's Python with the hook installed and ENVVAULT_STAMP unset, against the same venv
  without the hook (it must cost nothing).

Goals stated in absolute units are judged on the value; the anchor, measured in the same run, is there to
put the value in proportion (``limit`` is then the bound divided by the anchor). Stamping runs in the torch
venv's own interpreter with envvault linked in (same ABI as this interpreter), as the .pth hook does.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    Figure, ROOT, drop_dirty, ensure_torch_venv, envvault_cmd, ev_env, machine, median, report, run, save,
    timed_rss,
)

OVERHEAD = textwrap.dedent("""
    import json, os, sys, time, torch
    import envvault.torch as et
    from envvault.torch import plugin
    vault, path, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    et.enable(vault=vault, full_snapshot=False)
    torch.save({"warm": 1}, path)  # the first stamp of the process is not what this measures
    plain_save = torch.save.__envvault_original__
    tensors = {f"layer{i}.weight": torch.randn(1024, 2560) for i in range(10)}  # 10 x 10 MiB float32
    objs = {"dict": {"model": tensors, "epoch": 3, "config": {"lr": 0.1}}, "state_dict": tensors}
    out = {"bytes": sum(t.numel() * 4 for t in tensors.values())}
    for label, obj in objs.items():
        plain, stamped = [], []
        for r in range(runs):
            pair = [(plain, plain_save), (stamped, torch.save)]
            for wall, save in (pair if r % 2 == 0 else pair[::-1]):
                os.sync()
                t = time.perf_counter()
                save(obj, path)
                wall.append((time.perf_counter() - t) * 1000)
        inside = []
        for _ in range(200):
            t = time.perf_counter()
            plugin._plan_torch_save(obj, (), {})
            inside.append((time.perf_counter() - t) * 1000)
        out[label] = {"plain": plain, "stamped": stamped, "inside": inside}
    print(json.dumps(out))
    """)

FIRST = textwrap.dedent("""
    import json, sys, time
    t = time.perf_counter()
    import torch
    torch_import = time.perf_counter() - t
    vault, path = sys.argv[1], sys.argv[2]
    small = {"epoch": 1, "model": {"w": torch.zeros(4)}}
    torch.save(small, path)
    t = time.perf_counter(); torch.save(small, path); plain = time.perf_counter() - t
    t = time.perf_counter()
    import envvault.torch
    envvault.torch.enable(vault=vault, full_snapshot=False)
    torch.save(small, path)
    first = time.perf_counter() - t - plain
    stamp = torch.load(path, weights_only=True)["envvault"]
    print(json.dumps({"torch_import": torch_import * 1000, "first": first * 1000, "snapshot": stamp["snapshot"],
                      "lock_only": stamp["snapshot_lock_only"], "warnings": stamp["warnings"]}))
    """)

TORCH_LOAD = textwrap.dedent("""
    import sys, zipfile, torch
    ckpt = torch.load(sys.argv[1], mmap=zipfile.is_zipfile(sys.argv[1]), weights_only=True)  # legacy: no mmap
    print(len(ckpt))
    """)

BIG = textwrap.dedent("""
    import sys, torch
    out = sys.argv[1]
    groups = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))]).state_dict()["param_groups"]
    groups[0]["params"] = list(range(250))
    state = {i: {"step": torch.tensor(1.0), "exp_avg": torch.empty(256, 1365), "exp_avg_sq": torch.empty(256, 1365)}
             for i in range(250)}
    many = {"model": {f"blocks.{i}.w": torch.empty(256, 1365) for i in range(250)},
            "optimizer": {"state": state, "param_groups": groups}, "epoch": 3}
    torch.save(many, out + "/many.pt")
    del many, state
    big = {f"layer{i}.weight": torch.empty(8192, 4096) for i in range(8)}
    torch.save(big, out + "/big-legacy.pt", _use_new_zipfile_serialization=False)
    """)


def absolute(name: str, value: float, unit: str, anchor_name: str, anchor: float, bound: float, **kw) -> Figure:
    """A figure whose goal is ``value <= bound``; the anchor gives proportion (limit = bound / anchor)."""
    return Figure(name, value, unit, anchor_name, anchor, f"<= {bound:g} {unit}", bound / anchor, **kw)


def stamping_env(libs: Path) -> dict:
    env = ev_env()
    env["PYTHONPATH"] = str(libs)  # envvault and its dependencies, linked; the venv's own packages win
    return env


def measure(venv: Path, runs: int, work: Path) -> tuple[list[Figure], dict]:
    from envvault.torch.hook import install_hook, link_runtime

    python = venv / "bin" / "python"
    libs = link_runtime(work / "envvault.libs")
    env = stamping_env(libs)
    vault = work / "vault"
    run(envvault_cmd(vault, "snap", "--venv", venv, "--no-caches", "--json"), env=ev_env())  # "already vaulted"
    figs: list[Figure] = []
    extra: dict = {}

    # -- per-save overhead, 100 MB ------------------------------------------------------------------------
    proc = run([python, "-c", OVERHEAD, vault, work / "ckpt.pt", str(runs)], env=env)
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    for label in ("dict", "state_dict"):
        d = doc[label]
        save_ms = median(d["plain"])
        goal = ("that save unstamped (ms)", save_ms, "<= 5 ms + 2% of the save", (5 + 0.02 * save_ms) / save_ms)
        figs.append(Figure(f"stamp overhead per save, 100 MB {label}: stamp work (ms)", median(d["inside"]), "ms",
                           *goal, notes="the wrapper's own work (stamp, drift check, record bytes), 200 calls"))
        diffs = [b - a for a, b in zip(d["plain"], d["stamped"])]
        spread = statistics.pstdev(diffs)
        figs.append(Figure("  cross-check: stamped minus plain save, paired (ms)", median(diffs), "ms",
                           goal[0], save_ms, f"none: pairs scatter by {spread:.0f} ms (sd) here",
                           samples=[round(x, 2) for x in diffs],
                           notes="whole saves, record write included; cannot resolve a sub-ms cost on a shared "
                                 "machine, so it is shown, not judged"))
    extra["overhead_raw"] = doc

    # -- the first stamp of a process, environment already vaulted ---------------------------------------
    firsts, imports, snaps = [], [], set()
    for _ in range(max(3, runs // 2)):
        drop_dirty()
        proc = run([python, "-c", FIRST, vault, work / "first.pt"], env=env)
        d = json.loads(proc.stdout.strip().splitlines()[-1])
        assert d["snapshot"] and d["lock_only"] is False and not d["warnings"], d  # it found the full snap
        firsts.append(d["first"])
        imports.append(d["torch_import"])
        snaps.add(d["snapshot"])
    assert len(snaps) == 1
    figs.append(absolute("first stamp in a process, env already vaulted (ms)", median(firsts), "ms",
                         "import torch in that process (ms)", median(imports), 300,
                         samples=[round(x, 1) for x in firsts],
                         notes="samples in order: the first one ran right after `envvault snap`"))

    # Informational: the same when the environment is not in the vault yet (a lock-only snapshot is taken).
    colds = []
    for i in range(3):
        proc = run([python, "-c", FIRST, work / f"cold{i}", work / "first.pt"], env=env)
        colds.append(json.loads(proc.stdout.strip().splitlines()[-1])["first"])
    figs.append(Figure("first stamp, env not vaulted yet: lock-only snapshot (ms)", median(colds), "ms",
                       samples=[round(x, 1) for x in colds], notes="no goal; the full snap runs in the background"))

    # -- inspect of 1 GB checkpoints ---------------------------------------------------------------------
    run([python, "-c", BIG, work], env=ev_env())
    for name in ("many.pt", "big-legacy.pt"):
        path = work / name
        walls, rsss, twalls, trss = [], [], [], []
        for _ in range(3):
            w, r, proc = timed_rss(envvault_cmd(vault, "inspect", path, "--json"), env=ev_env())
            assert json.loads(proc.stdout)["tensors"]["bytes"] > 1_000_000_000
            walls.append(w)
            rsss.append(r / 1e6)
            w, r, _ = timed_rss([python, "-c", TORCH_LOAD, path], env=ev_env())
            twalls.append(w)
            trss.append(r / 1e6)
        size = path.stat().st_size / 1e9
        figs.append(absolute(f"inspect {name} ({size:.2f} GB): wall (s)", median(walls), "s",
                             "torch.load(weights_only, mmap if zip), fresh process (s)", median(twalls), 1.0,
                             samples=walls))
        figs.append(absolute(f"inspect {name}: peak RSS (MB)", max(rsss), "MB",
                             "that torch.load's peak RSS (MB)", max(trss), 100, samples=rsss))
        path.unlink()

    # -- the hook costs nothing when ENVVAULT_STAMP is unset: two like venvs, one hooked, interleaved ------
    quiet = ev_env()
    quiet.pop("PYTHONPATH", None)
    pair = {}
    for name in ("bare", "hooked"):
        run([sys.executable, "-m", "venv", "--without-pip", work / name])
        pair[name] = []
    install_hook(work / "hooked")
    for _ in range(31):
        for name in pair:
            t = time.perf_counter()
            run([work / name / "bin" / "python", "-c", "pass"], env=quiet)
            pair[name].append((time.perf_counter() - t) * 1000)
    figs.append(Figure("python -c pass, hook installed, ENVVAULT_STAMP unset (ms)", median(pair["hooked"]), "ms",
                       "a like venv without the hook (ms)", median(pair["bare"]), "<= 1.1x", 1.1))
    return figs, extra


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--venv", type=Path, help="a venv with torch 2.13.0+cpu (default: build bench/out/torchvenv)")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    args = ap.parse_args()
    venv = ensure_torch_venv(args.venv)
    work = Path(tempfile.mkdtemp(prefix="evbench-stamp-"))
    try:
        figs, extra = measure(venv, args.runs, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    path = save(figs, "stamp", {"venv": str(venv), "runs": args.runs, **extra})
    if args.json:
        print(json.dumps({"machine": machine(), "figures": [f.to_json() for f in figs]}, indent=1))
    else:
        report(figs, "checkpoint stamps (issue 5)")
        print(f"\nsaved {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
