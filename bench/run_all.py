"""Run every benchmark and write docs/benchmarks.md: each figure beside its anchor, from the same run.

    python bench/run_all.py [--venv PATH] [--runs 3] [--only snap,restore,caches,guard,stamp] [--render-only]

The GPU round trip (issue 4) runs on a GPU machine with bench/gpu_cache_run.sh; its JSON is kept in
bench/results/gpu_cache_h200.json and rendered here.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import OUT, ROOT, ensure_torch_venv, machine  # noqa: E402

BENCHES = {
    "snap": ("bench_snap.py", "Snapshots (issue 2)"),
    "restore": ("bench_restore.py", "Restore, diff, status (issue 3)"),
    "caches": ("bench_caches.py", "Compile caches (issue 4)"),
    "stamp": ("bench_stamp.py", "Checkpoint stamps (issue 5)"),
    "guard": ("bench_guard.py", "Guarded installs (issue 6)"),
}


def _fmt(x, unit="") -> str:
    if x is None:
        return ""
    if isinstance(x, float):
        if abs(x) >= 100:
            return f"{x:,.0f}"
        return f"{x:.3f}"
    return str(x)


def render(results: dict[str, dict]) -> str:
    lines = ["# Benchmarks", "",
             "Each figure is measured beside its anchor in the same run (medians; the machines are shared and",
             "noisy, so compare ratios). Regenerate with `python bench/run_all.py`; raw numbers are in",
             "`bench/out/*.json` after a run.", ""]
    first = next(iter(results.values()), None)
    if first:
        m = first.get("machine", {})
        lines += [f"Machine: {m.get('cpu')} ({m.get('cores')} cores), {m.get('memory_gib')} GiB, {m.get('os')}, "
                  f"Python {m.get('python')}, {m.get('zstd')}.", ""]
    for key, (_, title) in BENCHES.items():
        res = results.get(key)
        if not res:
            continue
        when = (res.get("machine") or {}).get("date", "")
        lines += [f"## {title}", "", f"Run {when}.", "", "| figure | value | anchor | anchor value | ratio | goal | met |",
                  "| --- | ---: | --- | ---: | ---: | --- | --- |"]
        for f in res["figures"]:
            ratio = f"{f['ratio']:.2f}x" if f.get("ratio") is not None else ""
            met = {True: "yes", False: "**no**", None: ""}[f.get("ok")]
            cell = lambda t: str(t).replace("|", "\\|")  # noqa: E731 - anchors are shell pipelines
            lines.append(f"| {cell(f['name'])} | {_fmt(f['value'])} | {cell(f.get('anchor_name', ''))} | "
                         f"{_fmt(f.get('anchor'))} | {ratio} | {cell(f.get('goal', ''))} | {met} |")
        notes = [f"- {f['name']}: {f['notes']}" for f in res["figures"] if f.get("notes")]
        if notes:
            lines += [""] + notes
        lines.append("")
    gpu = ROOT / "bench" / "results" / "gpu_cache_h200.json"
    if gpu.exists():
        s = json.loads(gpu.read_text()).get("summary", {})
        p = s.get("probe") or {}
        lines += ["## Compile cache on a real GPU (issue 4)", "",
                  f"`bench/gpu_cache_run.sh` on one NVIDIA H200 (torch {p.get('torch')}, Triton {p.get('triton')}, "
                  f"Python {p.get('python')}, 16 cores): `flex_workload.py`'s own total seconds.", "",
                  "| run | workload seconds | process wall (s) |", "| --- | ---: | ---: |",
                  f"| cold (empty caches) | {_fmt(s.get('cold_s'))} | {_fmt(s.get('cold_wall_s'))} |",
                  f"| warm (cache kept) | {_fmt(s.get('warm_s'))} | {_fmt(s.get('warm_wall_s'))} |",
                  f"| restored (caches deleted, then `envvault cache restore`) | {_fmt(s.get('restored_s'))} | "
                  f"{_fmt(s.get('restored_wall_s'))} |", "",
                  f"Restored / warm = **{s.get('restored_over_warm')}x** (goal <= 1.3x). `envvault cache snap` "
                  f"took {s.get('snap_wall_s')} s (CLI wall) against `tar | zstd -T0 -3` {s.get('tar_zstd_wall_s')} s; "
                  f"`envvault cache restore` {s.get('restore_wall_s')} s against `zstd -dc | tar -x` "
                  f"{s.get('untar_wall_s')} s; vault {s.get('vault_bytes')} bytes against the archive's "
                  f"{s.get('archive_bytes')}.", ""]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--venv", type=Path)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default=",".join(BENCHES))
    ap.add_argument("--render-only", action="store_true", help="render docs/benchmarks.md from bench/out/*.json")
    args = ap.parse_args()
    wanted = [k for k in args.only.split(",") if k]
    if not args.render_only:
        venv = ensure_torch_venv(args.venv)
        for key in wanted:
            script, title = BENCHES[key]
            cmd = [sys.executable, str(ROOT / "bench" / script), "--runs", str(args.runs)]
            if key != "caches":
                cmd += ["--venv", str(venv)]
            else:
                cmd += ["--torch-python", str(venv / "bin" / "python")]
            print(f"== {title}: {' '.join(cmd)}", flush=True)
            subprocess.run(cmd, check=False)
    results = {}
    for key in BENCHES:
        path = OUT / f"{key}.json"
        if path.exists():
            results[key] = json.loads(path.read_text())
    (ROOT / "docs" / "benchmarks.md").write_text(render(results))
    print(f"wrote {ROOT / 'docs' / 'benchmarks.md'}; machine: {machine()['cpu']}")


if __name__ == "__main__":
    main()
