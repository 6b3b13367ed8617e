"""Where the quick ``status`` spends its time on the device (issue 11): envvault in a venv of its own (uv,
bytecode compiled), the device's real venv snapped into a fresh vault, one full ``status`` to leave the
verdict, then, 9 rounds each, alternately: the interpreter alone (``python -c pass``), the quick path's
imports alone, and the quick ``status``; one cProfile of ``verdict.unchanged_since`` in process, and its time
in process under five sizings of the forked check.

Run by ``bench/gpu_quick_profile.sh`` (which installs the carried wheels first); writes
``$OUT/gpu_quick_profile.txt``.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

OUT = os.environ.get("OUT", "/tmp")
W = "/tmp/gqp"
UV = os.environ.get("UV", "/tmp/site/bin/uv")
WHEELS = os.environ["WHEELS"]
IMPORTS = ("import envvault.entry, envvault.quick, envvault.vault.location, envvault.snap.verdict, "
           "envvault.env.probe, envvault.env.reader, envvault.env.venv, envvault.vault.local, envvault.vault.state")

lines: list[str] = []


def say(text: str) -> None:
    print(text, flush=True)
    lines.append(text)


def run(cmd: list[str], env: dict | None = None) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        say(f"rc {p.returncode}: {' '.join(cmd)}: {p.stderr[-300:]}")
    return wall


def tool_venv(work: str) -> tuple[str, dict]:
    """envvault in a venv of its own under ``work`` (made afresh: uv, the carried wheels, bytecode compiled)
    and the environment to run it in (a vault at ``work``/vault); (the venv, the environment)."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run(["rm", "-rf", work], check=True)
    os.makedirs(work)
    tool = f"{work}/tool"
    subprocess.run(f"{base} -m venv --without-pip {tool} && {UV} pip install -q --offline --no-index --no-deps "
                   f"--compile-bytecode --python {tool}/bin/python {WHEELS}/*.whl", shell=True, check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["ENVVAULT_HOME"] = f"{work}/vault"
    return tool, env


def main() -> None:
    venv = sys.prefix
    tool, env = tool_venv(W)
    ev = [f"{tool}/bin/envvault"]
    say(f"snap: {run(ev + ['snap', '--venv', venv, '--no-caches', '-m', 'full'], env):.2f} s")
    say(f"full status (leaves the verdict): {run(ev + ['status', '--venv', venv], env):.3f} s")
    py = f"{tool}/bin/python"
    rows = {"python -c pass": [py, "-c", "pass"], "quick path's imports": [py, "-c", IMPORTS],
            "quick status": ev + ["status", "--venv", venv, "--exit-code"],
            "pip freeze": [sys.executable, "-m", "pip", "freeze"]}
    walls: dict[str, list[float]] = {k: [] for k in rows}
    for i in range(9):
        for name in list(rows)[i % len(rows):] + list(rows)[:i % len(rows)]:
            walls[name].append(run(rows[name], env))
    for name, ws in walls.items():
        say(f"{name}: median {statistics.median(ws) * 1000:.1f} ms ({min(ws) * 1000:.1f}-{max(ws) * 1000:.1f})")
    # In process, under the tool's interpreter: unchanged_since's own time, and where it goes.
    prelude = ("import cProfile, pstats, io, time, sys\n"
               "from envvault.vault import forked\n"
               "from envvault.snap.verdict import unchanged_since\n"
               "from envvault.vault.location import default_vault_path\n"
               f"root, venv = default_vault_path(None), {venv!r}\n")
    code = prelude + (
        "assert unchanged_since(root, venv) is not None\n"
        "pr = cProfile.Profile(); pr.enable(); unchanged_since(root, venv); pr.disable()\n"
        "s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats('tottime').print_stats(18); print(s.getvalue())\n"
    )
    p = subprocess.run([py, "-c", code], capture_output=True, text=True, env=env)
    say(p.stdout + p.stderr[-2000:])
    # unchanged_since in process, under each sizing of the forked check (vault/forked.py: at most
    # _MAX_CHILDREN processes, _WEIGHT_A_CHILD files each at least; 16, 3000 is envvault's since 6969ae6's sweep), in turn round by round.
    sweep = prelude + (
        "settings = [(8, 4000), (12, 3000), (16, 3000), (16, 2000), (24, 2000)]\n"
        "ts = {s: [] for s in settings}\n"
        "for r in range(9):\n"
        "    for s in settings[r % 5:] + settings[:r % 5]:\n"
        "        forked._MAX_CHILDREN, forked._WEIGHT_A_CHILD = s\n"
        "        t = time.perf_counter(); assert unchanged_since(root, venv) is not None; ts[s].append(time.perf_counter() - t)\n"
        "for s, v in ts.items():\n"
        "    v.sort(); print(f'children {s[0]}, {s[1]} files a child at least: median {v[4]*1000:.1f} ms ({v[0]*1000:.1f}-{v[-1]*1000:.1f})')\n"
    )
    p = subprocess.run([py, "-c", sweep], capture_output=True, text=True, env=env)
    say(p.stdout + p.stderr[-2000:])
    p = subprocess.run([py, "-X", "importtime", "-c", IMPORTS], capture_output=True, text=True, env=env)
    top = sorted((ln for ln in p.stderr.splitlines() if ln.startswith("import time:") and "self" not in ln),
                 key=lambda ln: -int(ln.split("|")[1]))[:25]
    say("\n".join(top))
    with open(os.path.join(OUT, "gpu_quick_profile.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
