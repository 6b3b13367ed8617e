"""Where the start-up-bound commands other than the quick ``status`` spend their time on the device (issue 11):
the second snap (with the compile caches it discovers, and with ``--no-caches``), ``--lock-only`` and the
compile cache restore. envvault in a venv of its own (uv, bytecode compiled), the device's real venv snapped
into a fresh vault; then, 9 rounds each, alternately: ``python -c pass``, the quick ``status``, the three
snaps, ``pip freeze`` and ``uv pip freeze``; the same for the compile cache restore beside its anchor when the
H200 cache is carried (``CACHE_TAR``); then, once each, ``ENVVAULT_STAGES=1``, ``-X importtime`` (the 30
largest cumulative imports) and cProfile (the 30 largest own times) of each command.

Run by ``bench/gpu_snap_profile.sh`` (which installs the carried wheels first); writes
``$OUT/gpu_snap_profile.txt``.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

from gpu_quick_profile import OUT, UV, tool_venv  # the same device set-up (bench/ is this script's folder)

W = "/tmp/gsp"
CACHE_TAR = os.environ.get("CACHE_TAR", "")
ZSTD_D = "import sys, zstandard; zstandard.ZstdDecompressor().copy_stream(sys.stdin.buffer, sys.stdout.buffer)"

lines: list[str] = []


def say(text: str) -> None:
    print(text, flush=True)
    lines.append(text)
    with open(os.path.join(OUT, "gpu_snap_profile.txt"), "w") as f:  # as it goes: a later failure keeps it
        f.write("\n".join(lines) + "\n")


def run(cmd, env: dict, before: str | None = None) -> float:
    if before:
        subprocess.run(before, shell=True, check=True)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, shell=isinstance(cmd, str))
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        say(f"rc {p.returncode}: {cmd}: {p.stderr[-300:]}")
    return wall


def rounds(rows: dict, env: dict, n: int = 9) -> None:
    """Each row ``name: (cmd, before)`` n times, the order rotating round by round; medians printed."""
    walls: dict[str, list[float]] = {k: [] for k in rows}
    names = list(rows)
    for i in range(n):
        for name in names[i % len(names):] + names[:i % len(names)]:
            cmd, before = rows[name]
            walls[name].append(run(cmd, env, before))
    for name, ws in walls.items():
        say(f"{name}: median {statistics.median(ws) * 1000:.1f} ms ({min(ws) * 1000:.1f}-{max(ws) * 1000:.1f})")


def profiles(name: str, args: list[str], py: str, env: dict, before: str | None = None) -> None:
    """Stages, imports and a cProfile of one command (``python -m envvault`` with ``args``)."""
    if before:
        subprocess.run(before, shell=True, check=True)
    p = subprocess.run([py, "-m", "envvault", *args], capture_output=True, text=True,
                       env={**env, "ENVVAULT_STAGES": "1"})
    say(f"== {name}: stages (rc {p.returncode})\n" + "\n".join(
        ln for ln in p.stderr.splitlines() if "stage" in ln or "RSS" in ln))
    if before:
        subprocess.run(before, shell=True, check=True)
    p = subprocess.run([py, "-X", "importtime", "-m", "envvault", *args], capture_output=True, text=True, env=env)
    imports = [ln for ln in p.stderr.splitlines() if ln.startswith("import time:") and "self" not in ln]
    total = sum(int(ln.split("|")[0].split(":")[1]) for ln in imports)
    top = sorted(imports, key=lambda ln: -int(ln.split("|")[1]))[:30]
    say(f"== {name}: -X importtime, {len(imports)} modules, {total / 1000:.1f} ms of own import time in all\n"
        + "\n".join(top))
    if before:
        subprocess.run(before, shell=True, check=True)
    p = subprocess.run([py, "-m", "cProfile", "-s", "tottime", "-m", "envvault", *args], capture_output=True,
                       text=True, env={**env, "ENVVAULT_QUICK_EXIT": "0"})
    say(f"== {name}: cProfile (own time)\n" + "\n".join(p.stdout.splitlines()[:45]))


def main() -> None:
    venv = sys.prefix
    tool, env = tool_venv(W)
    ev = f"{tool}/bin/envvault"
    py = f"{tool}/bin/python"
    say(f"snap: {run([ev, 'snap', '--venv', venv, '-m', 'full'], env):.2f} s")
    say(f"status (leaves the verdict): {run([ev, 'status', '--venv', venv], env):.3f} s")
    rounds({
        "python -c pass": ([py, "-c", "pass"], None),
        "quick status": ([ev, "status", "--venv", venv, "--exit-code"], None),
        "second snap": ([ev, "snap", "--venv", venv, "-m", "again"], None),
        "second snap --no-caches": ([ev, "snap", "--venv", venv, "-m", "again", "--no-caches"], None),
        "--lock-only": ([ev, "snap", "--venv", venv, "--lock-only", "-m", "lo"], None),
        "pip freeze": ([sys.executable, "-m", "pip", "freeze"], None),
        "uv pip freeze": ([UV, "pip", "freeze", "--python", sys.executable], None),
    }, env)
    profiles("second snap", ["snap", "--venv", venv, "-m", "again"], py, env)
    profiles("second snap --no-caches", ["snap", "--venv", venv, "-m", "again", "--no-caches"], py, env)
    profiles("--lock-only", ["snap", "--venv", venv, "--lock-only", "-m", "lo"], py, env)
    if CACHE_TAR:
        c, cache_env = f"{W}/cache", {**env, "ENVVAULT_HOME": f"{W}/cvault"}
        subprocess.run(f"rm -rf {c} && mkdir -p {c} && {py} -c '{ZSTD_D}' <{CACHE_TAR} | tar -xf - -C {c}",
                       shell=True, check=True)
        say(f"cache snap: {run([ev, 'cache', 'snap', '--no-discover', '--cache-dir', c, '-m', 'c'], cache_env):.3f} s")
        subprocess.run(f"tar -cf - -C {c} . | {py} -c 'import sys, zstandard; zstandard.ZstdCompressor("
                       f"level=3, threads=-1).copy_stream(sys.stdin.buffer, sys.stdout.buffer)' >{W}/cache.tar.zst",
                       shell=True, check=True)
        r = f"{W}/restored"
        rounds({
            "zstd -dc | tar -x (cache)": (f"{py} -c '{ZSTD_D}' <{W}/cache.tar.zst | tar -xf - -C {r}",
                                          f"rm -rf {r} && mkdir -p {r}"),
            "cache restore": ([ev, "cache", "restore", "--to", r], f"rm -rf {r}"),
            "python -c pass": ([py, "-c", "pass"], None),
        }, cache_env)
        profiles("cache restore", ["cache", "restore", "--to", r], py, cache_env, before=f"rm -rf {r}")


if __name__ == "__main__":
    main()
