#!/usr/bin/env bash
# The compile-cache round trip on a real GPU (issue 4, item 6). Run from the repository root on an H200
# machine whose python3 has torch 2.11 and Triton 3.6, without network; envvault and its dependencies are
# carried as wheels in .whl/.
#
#   1. flex_workload.py cold, with fresh cache folders (Inductor, Triton, CUDA JIT, torch extensions)
#   2. envvault cache snap            3. the workload warm
#   4. delete every cache folder      5. envvault cache restore        6. the workload again ("restored")
#
# Writes $OUT/gpu_cache.json (after every step, so a timeout still leaves what was measured): the workload's
# own total seconds cold / warm / restored, the process walls, the snap and restore walls, and the same
# machine's `tar | zstd -T0 -3` and `zstd -dc | tar -x` of the cache as anchors. Goal: restored <= 1.3x warm.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >"$OUT/pip.log" 2>&1 || echo "pip install failed, see pip.log" >&2
export PYTHONPATH=/tmp/site:$PWD
WORKLOAD=bench/flex_workload.py
[ -f "$WORKLOAD" ] || WORKLOAD=../shared/tools/flex_workload.py

exec python3 - "$OUT" "$WORKLOAD" <<'PY'
import json, os, shutil, subprocess, sys, tempfile, time, traceback

out_dir, workload = sys.argv[1], os.path.abspath(sys.argv[2])
work = tempfile.mkdtemp(prefix="gpucache-")
vault = os.path.join(work, "vault")
caches = {name: os.path.join(work, name) for name in ("inductor", "tritonhome", "nv", "ext", "tmp")}
# TMPDIR too: Inductor keeps precompiled headers under its default root, in the temp dir.
env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=caches["inductor"], TRITON_HOME=caches["tritonhome"],
           CUDA_CACHE_PATH=caches["nv"], TORCH_EXTENSIONS_DIR=caches["ext"], TMPDIR=caches["tmp"])
os.makedirs(caches["tmp"])
for k in ("TRITON_CACHE_DIR", "VIRTUAL_ENV", "ENVVAULT_HOME"):
    env.pop(k, None)
result = {"workload": workload, "work": work, "steps": {}, "errors": []}


def save():
    with open(os.path.join(out_dir, "gpu_cache.json"), "w") as f:
        json.dump(result, f, indent=1)


def run(name, cmd, timeout=600, sync=False):
    if sync:
        os.sync()  # the previous step's dirty pages are not this step's cost
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, shell=isinstance(cmd, str))
        wall = round(time.perf_counter() - t, 3)
        step = {"wall_s": wall, "rc": p.returncode, "stderr_tail": p.stderr[-1500:]}
        lines = [ln for ln in p.stdout.strip().splitlines() if ln.strip()]
        if lines:
            try:
                step["json"] = json.loads(p.stdout) if p.stdout.lstrip().startswith("{\n") else json.loads(lines[-1])
            except ValueError:
                step["stdout_tail"] = p.stdout[-1500:]
        if p.returncode != 0:
            result["errors"].append(f"{name} exited {p.returncode}")
    except Exception as err:  # one try: record and go on
        step = {"wall_s": round(time.perf_counter() - t, 3), "error": repr(err)}
        result["errors"].append(f"{name}: {err!r}")
    result["steps"][name] = step
    save()
    return step


PROBE = """
import json, sys
facts = {"prefix": sys.prefix, "python": sys.version.split()[0]}
try:
    import torch
    facts.update(torch=torch.__version__, cuda=torch.version.cuda)
    facts["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    import triton
    facts["triton"] = triton.__version__
except Exception as err:
    facts["error"] = repr(err)
print(json.dumps(facts))
"""


def total(step):
    return (step.get("json") or {}).get("total_s")


def du(path):
    n = files = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                n += os.lstat(os.path.join(root, name)).st_size
                files += 1
            except OSError:
                pass
    return n, files


try:
    probe = run("probe", [sys.executable, "-c", PROBE])
    prefix = (probe.get("json") or {}).get("prefix")
    venv_args = ["--venv", prefix] if prefix and os.path.exists(os.path.join(prefix, "pyvenv.cfg")) else []
    ev = [sys.executable, "-m", "envvault", "--vault", vault]

    cold = run("cold", [sys.executable, workload])
    result["cache_bytes"], result["cache_files"] = du(caches["inductor"])
    snap = run("snap", ev + ["cache", "snap", "-m", "flex cold"] + venv_args + ["--json"], sync=True)
    sid = (snap.get("json") or {}).get("id")
    warm = run("warm", [sys.executable, workload])
    for path in caches.values():
        shutil.rmtree(path, ignore_errors=True)
    os.makedirs(caches["tmp"])
    restore = run("restore", ev + ["cache", "restore", sid or "latest"] + venv_args + ["--json"], sync=True)
    restored = run("restored", [sys.executable, workload])

    # Anchors on the same machine and the same tree (now restored and used once more).
    archive = os.path.join(work, "anchor.tar.zst")
    parent, base = os.path.split(caches["inductor"])
    if shutil.which("zstd"):
        pack, unpack = "zstd -T0 -3 -q -c", "zstd -dc"
    else:  # the zstd command may be missing there: the same compressor through python-zstandard
        z = f"'{sys.executable}' -c 'import sys, zstandard as z; "
        pack = z + "z.ZstdCompressor(level=3, threads=-1).copy_stream(sys.stdin.buffer, sys.stdout.buffer)'"
        unpack = z + "z.ZstdDecompressor().copy_stream(open(sys.argv[1], \"rb\"), sys.stdout.buffer)'"
    result["anchor_commands"] = [pack, unpack]
    tar = run("anchor_tar_zstd", f"tar -cf - -C '{parent}' '{base}' | {pack} > '{archive}'", sync=True)
    os.makedirs(os.path.join(work, "untar"), exist_ok=True)
    untar = run("anchor_untar", f"{unpack} '{archive}' | tar -x -C '{work}/untar'", sync=True)

    vault_bytes = sum(os.path.getsize(os.path.join(r, n)) for sub in ("packs", "index", "snapshots")
                      for r, _, ns in os.walk(os.path.join(vault, sub)) for n in ns)
    result["summary"] = {
        "probe": probe.get("json"),
        "cold_s": total(cold), "warm_s": total(warm), "restored_s": total(restored),
        "restored_over_warm": round(total(restored) / total(warm), 3) if total(restored) and total(warm) else None,
        "cold_wall_s": cold.get("wall_s"), "warm_wall_s": warm.get("wall_s"), "restored_wall_s": restored.get("wall_s"),
        "snap_wall_s": snap.get("wall_s"), "restore_wall_s": restore.get("wall_s"),
        "tar_zstd_wall_s": tar.get("wall_s"), "untar_wall_s": untar.get("wall_s"),
        "vault_bytes": vault_bytes, "archive_bytes": os.path.getsize(archive) if os.path.exists(archive) else None,
        "restore_warnings": (restore.get("json") or {}).get("warnings"),
    }
except Exception:
    result["errors"].append(traceback.format_exc()[-3000:])
save()
print(json.dumps(result.get("summary", result), indent=1))
PY
