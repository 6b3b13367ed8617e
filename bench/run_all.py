"""Run every benchmark and write docs/benchmarks.md: each figure beside its anchor, from the same run.

    python bench/run_all.py [--venv PATH] [--runs 3] [--only snap,restore,caches,guard,stamp] [--render-only]

The GPU round trip (issue 4) runs on a GPU machine with bench/gpu_cache_run.sh; its JSON is kept in
bench/results/gpu_cache_h200.json and rendered here. So is issue 11's device run (bench/gpu_env_run.sh:
bench/results/gpu_env_run.json beside the run it started from, gpu_env_run_baseline.json). Narrative sections
of device runs that have no JSON rendering (bench/results/*.md) are included as they are. The S3 figures
(issue 12) come from bench/bench_s3.py (``--only s3``), which starts its own moto server.
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
    "s3": ("bench_s3.py", "A vault in a bucket (issue 12)"),
}


def _fmt(x, unit="") -> str:
    if x is None:
        return ""
    if isinstance(x, float):
        if abs(x) >= 100:
            return f"{x:,.0f}"
        return f"{x:.3f}"
    return str(x)


def _device_rows() -> list[str]:
    """Issue 11's device table: each row of the latest run beside the baseline run's, with the anchors."""
    res = ROOT / "bench" / "results"
    now_p, base_p = res / "gpu_env_run.json", res / "gpu_env_run_baseline.json"
    mid_name = "5bef900"  # the last whole run of median 3 before this one (the thirty-sixth session)
    mid_p = res / f"gpu_env_run_{mid_name}.json"
    if not now_p.exists():
        return []
    now = json.loads(now_p.read_text())
    base = {r["figure"]: r for r in json.loads(base_p.read_text())["rows"]} if base_p.exists() else {}
    mid_doc = json.loads(mid_p.read_text()) if mid_p.exists() else {"rows": [], "machine": {}}
    mid = {r["figure"]: r for r in mid_doc["rows"]}
    m = now.get("machine", {})
    lines = ["## Speed where users live: the GPU host's real venv (issue 11)", "",
             f"`bench/gpu_env_run.sh` on the device machine ({m.get('cores')} cores, {m.get('gpu', 'one H200')}), its `python3` venv "
             f"`{m.get('venv')}` (Python {m.get('python')}, {m.get('files')} files), median of {m.get('repeat')} "
             f"run(s), page cache warm for envvault and anchor alike; code: {m.get('code', '?')}. 'before' is the "
             "same script on the code this work started from (`gpu_env_run_baseline.json`, one run, its anchor in "
             f"brackets); '{mid_name}' the last whole run before it "
             f"(`gpu_env_run_{mid_name}.json`: {mid_doc['machine'].get('code', '?')}), its ratio in brackets; a row "
             "with no 'now' was not rerun.", "",
             f"| figure | before | {mid_name} | now | anchor | anchor now | ratio now | goal |",
             "| --- | ---: | ---: | ---: | --- | ---: | ---: | --- |"]
    cell = lambda t: str(t).replace("|", "\\|")  # noqa: E731 - anchors are shell pipelines
    rows = {r["figure"]: r for r in now["rows"]}
    for fig in list(base) + [f for f in rows if f not in base]:
        b = base.get(fig, {})
        r = rows[fig] if fig in rows else {"figure": fig, "goal": b.get("goal", "")}
        m_ = mid.get(fig, {})
        if "envvault_bytes" in b:
            now_b = f"{_fmt(r['envvault_bytes'] / 1e9)} GB" if "envvault_bytes" in r else ""
            mid_b = f"{_fmt(m_['envvault_bytes'] / 1e9)} GB" if "envvault_bytes" in m_ else ""
            lines.append(f"| {fig} | {_fmt(b['envvault_bytes'] / 1e9)} GB | {mid_b} | {now_b} | the anchor's archive | "
                         f"{_fmt(r.get('anchor_bytes', b['anchor_bytes']) / 1e9)} GB | "
                         f"{(format(r['ratio'], '.3f') + 'x') if now_b else ''} | {r['goal']} |")
            continue
        ratio = f"{r['ratio']:.2f}x" if r.get("ratio") is not None else ""
        rss = r.get("rss_mb") or b.get("rss_mb")
        extra = f" (peak RSS {rss} MB, goal {r.get('rss_goal', '<= 300 MB')})" if rss else ""
        before = f"{_fmt(b.get('envvault_s'))}" + (f" [{_fmt(b['anchor_s'])}]" if b.get("anchor_s") else "")
        between = f"{_fmt(m_.get('envvault_s'))}" + (f" [{m_['ratio']:.2f}x]" if m_.get("ratio") is not None else "")
        lines.append(f"| {cell(fig)}{extra} | {before} | {between} | {_fmt(r.get('envvault_s'))} | "
                     f"{cell(r.get('anchor', b.get('anchor', '')))} | {_fmt(r.get('anchor_s'))} | {ratio} | "
                     f"{cell(r['goal'])} |")
    if now.get("errors"):
        lines += ["", "Steps that failed in that run: " + "; ".join(e[:160] for e in now["errors"])]
    return lines + [""]


def _s3_rows(res: dict) -> list[str]:
    f = res.get("figures", {})
    if not f:
        return []
    rows = [("push: `sync` of the torch venv's snapshot to the bucket", "push_sync_s",
             "one multipart upload of the venv's .tar.zst", "anchor_multipart_upload_s", "<= 1.2x"),
            ("restore on an empty node (`restore --into`)", "restore_into_empty_node_s",
             "download of that .tar.zst + extract", "anchor_download_extract_s", "<= 1.2x"),
            ("`list` of 1,000 snapshots made by snaps, first node to list", "list_1000_first_node_s",
             "`list` of the same 1,000 in a local vault", "anchor_list_1000_local_vault_s", "<= 1 s"),
            ("`list` of 1,000 snapshots, another new node", "list_1000_new_node_s",
             "`list` of the same 1,000 in a local vault", "anchor_list_1000_local_vault_s", "<= 1 s")]
    lines = ["## A vault in a bucket (issue 12)", "", f"Run {res.get('date', '')} against moto on 127.0.0.1 "
             "(`bench/bench_s3.py`).", "", "| figure | value (s) | anchor | anchor (s) | ratio | goal |",
             "| --- | ---: | --- | ---: | ---: | --- |"]
    for name, key, anchor, akey, goal in rows:
        v, a = f.get(key), f.get(akey)
        ratio = f"{v / a:.2f}x" if v and a else ""
        lines.append(f"| {name} | {_fmt(v)} | {anchor} | {_fmt(a)} | {ratio} | {goal} |")
    lines += ["", f"Second restore on the same node: {f.get('second_restore_remote_bytes')} bytes from the bucket in "
              f"{f.get('second_restore_requests')} requests (goal <= 1 MB). `list` of 1,000 snapshots: "
              f"{f.get('list_1000_first_node_requests', '?')} requests on the first node to list them, "
              f"{f.get('list_1000_new_node_requests')} on the next (goal <= 10), {f.get('list_1000_rows')} rows. "
              f"Committing the 999 (eight writers at a time, each sharing its head): "
              f"{_fmt(f.get('commit_999_snapshots_s'))} s.", ""]
    return lines


def render(results: dict[str, dict]) -> str:
    lines = ["# Benchmarks", "",
             "Each figure is measured beside its anchor in the same run (medians; the machines are shared and",
             "noisy, so compare ratios). Regenerate with `python bench/run_all.py`; raw numbers are in",
             "`bench/out/*.json` after a run.", "",
             "Both this machine's ext4 and the GPU host's have no journal: there a file made within minutes of",
             "a removal waits while the kernel skips every inode just freed. The `--into` rows and their uv",
             "anchors therefore no longer remove the last round's trees before a timed run: finished trees are",
             "emptied and put aside (`bench/common.py` `retire`; twenty-fourth session below). Rows defined by a removal",
             "(`rm -rf torch`, then restore) keep it, and so do their `tar -x` anchors.", ""]
    first = next((r for k, r in results.items() if k != "s3"), None)
    if first:
        m = first.get("machine", {})
        lines += [f"Machine: {m.get('cpu')} ({m.get('cores')} cores), {m.get('memory_gib')} GiB, {m.get('os')}, "
                  f"Python {m.get('python')}, {m.get('zstd')}.", ""]
    for key, (_, title) in BENCHES.items():
        res = results.get(key)
        if key == "s3":
            continue
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
    lines += _device_rows()
    for narrative in sorted((ROOT / "bench" / "results").glob("*.md")):
        lines += [narrative.read_text().rstrip("\n"), ""]
    if "s3" in results:
        lines += _s3_rows(results["s3"])
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
        # envvault's bytecode, as a wheel install leaves it (machines that set PYTHONDONTWRITEBYTECODE would
        # otherwise compile every module on every command, and time that)
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "envvault")], check=False)
        for key in wanted:
            script, title = BENCHES[key]
            cmd = [sys.executable, str(ROOT / "bench" / script), "--runs", str(args.runs)]
            if key == "s3":  # one run, its JSON on stdout
                import time
                p = subprocess.run([sys.executable, str(ROOT / "bench" / script), str(venv)],
                                   capture_output=True, text=True, check=False)
                print(p.stderr[-2000:], flush=True)
                if p.returncode == 0:
                    (OUT / "s3.json").write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                                             "figures": json.loads(p.stdout)}, indent=1))
                continue
            if key != "caches":
                cmd += ["--venv", str(venv)]
            else:
                cmd += ["--torch-python", str(venv / "bin" / "python")]
            print(f"== {title}: {' '.join(cmd)}", flush=True)
            subprocess.run(cmd, check=False)
    results = {}
    for key in BENCHES:
        path = OUT / f"{key}.json"
        if not path.exists() and (ROOT / "bench" / "results" / f"{key}.json").exists():
            path = ROOT / "bench" / "results" / f"{key}.json"  # the figures last kept
        if path.exists():
            results[key] = json.loads(path.read_text())
    (ROOT / "docs" / "benchmarks.md").write_text(render(results))
    print(f"wrote {ROOT / 'docs' / 'benchmarks.md'}; machine: {machine()['cpu']}")


if __name__ == "__main__":
    main()
