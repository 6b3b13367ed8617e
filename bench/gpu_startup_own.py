"""Where the start-up-bound rows (second snap, ``status``, ``--lock-only``) spend their time on the device
(issue 11): envvault in a venv of its own (uv, bytecode compiled) and in the measured venv (``PYTHONPATH``,
the carried wheels as ``gpu_env_run.sh`` installs them), the device's real venv snapped into a fresh vault,
then 9 rounds, each row in turn: the interpreters alone (``python -c pass``), each command's imports alone
(the modules ``-X importtime`` saw it import), the commands, and the anchors (``pip freeze``,
``uv pip freeze``). Then, once each under the own venv: the command's stages (``ENVVAULT_STAGES=1``), its
slowest imports and a cProfile. With ``WHEELS_OLD`` (a folder of wheels of another build), that build gets a
venv of its own too and its rows run beside the others, round by round.

Run by ``bench/gpu_quick_profile.sh gpu_startup_own.py`` (which installs the carried wheels first); writes
``$OUT/gpu_startup_own.txt``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

from gpu_quick_profile import lines, run, say, tool_venv

OUT = os.environ.get("OUT", "/tmp")
W = "/tmp/gso"


def imports_of(cmd: list[str], env: dict) -> str:
    """``import a, b, ...``: the envvault modules ``cmd`` (a ``python -m envvault`` command line) imports at
    its top level, as ``-X importtime`` lists them (``envvault.__main__`` left out: importing it runs the
    command line)."""
    p = subprocess.run([cmd[0], "-X", "importtime"] + cmd[1:], capture_output=True, text=True, env=env)
    mods = []
    for ln in p.stderr.splitlines():
        if ln.startswith("import time:") and "|" in ln:
            name = ln.split("|")[2]
            if name.startswith(" envvault") and not name.startswith("  ") and name.strip() != "envvault.__main__":
                mods.append(name.strip())
    return "import " + ", ".join(mods)


# Run as ``python -c``: the command's own imports, then the command, each timed on the system-wide monotonic
# clock against the moment the parent started the process (T0); the exit is timed from the last atexit hook.
# Inside the command, the time spent in each of WRAPPED (cumulative, nested calls counted in each) and in
# os.fsync.
WRAPPED = [("envvault.snap.take", "scan_environment"), ("envvault.snap.take", "build_snapshot"),
           ("envvault.vault.transaction", "SnapshotTransaction.commit"), ("envvault.vault.statcache", "StatCache.save"),
           ("envvault.restore.baseline", "leave_verdict"), ("envvault.snap", "statcache_for"),
           ("envvault.snap.scan", "fresh_groups"), ("envvault.env.probe", "find_target"),
           ("envvault.snap.verdict", "unchanged_since"), ("envvault.vault.statcache", "StatCache.__init__"),
           ("envvault.commands.plain", "_cache_hook"), ("envvault.caches.snap", "locations_to_snap"),
           ("envvault.caches.snap", "environment_fingerprint"), ("envvault.caches.snap", "archive_cache"), ("os", "fsync")]
DRIVER = """import time, os
t1 = time.monotonic()
import atexit, importlib, json, sys
{imports}
t2 = time.monotonic()
spent = {{}}
def wrap(modname, attr):
    owner = importlib.import_module(modname)
    name = attr
    if "." in attr:
        cls, name = attr.split(".")
        owner = getattr(owner, cls)
    fn = getattr(owner, name)
    def timed(*a, **k):
        t = time.monotonic()
        try:
            return fn(*a, **k)
        finally:
            spent[attr] = spent.get(attr, 0) + time.monotonic() - t
    setattr(owner, name, timed)
for modname, attr in {wrapped!r}:
    try:
        wrap(modname, attr)
    except (ImportError, AttributeError):
        pass
sys.argv = ["envvault"] + {args!r}
def _told():
    os.write(int(os.environ["TOLD_FD"]), json.dumps([t1, t2, time.monotonic(), spent]).encode())
atexit.register(_told)
from envvault.entry import main
main()
"""


def breakdown(py: str, args: list[str], env: dict, rounds: int = 9) -> str:
    """Medians over ``rounds`` runs of ``args`` under ``py``: the interpreter's start (to its first statement),
    the command's imports, the command (to its exit's atexit hooks) and the exit (to the parent's wait); then
    the time in each wrapped function (WRAPPED) the command called."""
    code = DRIVER.format(imports=imports_of([py, "-m", "envvault"] + args, env), args=args, wrapped=WRAPPED)
    parts: dict[str, list[float]] = {"start": [], "imports": [], "command": [], "exit": []}
    inside: dict[str, list[float]] = {}
    for _ in range(rounds):
        r, w = os.pipe()
        t0 = time.monotonic()
        p = subprocess.Popen([py, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             env=dict(env, TOLD_FD=str(w)), pass_fds=(w,))
        os.close(w)
        told = b""
        while chunk := os.read(r, 1 << 16):
            told += chunk
        err = p.communicate()[1]
        t4 = time.monotonic()
        os.close(r)
        if not told:
            return f"(the driver told nothing: {err.decode()[-300:]})"
        t1, t2, t3, spent = json.loads(told)
        for k, v in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            parts[k].append(v)
        for k, v in spent.items():
            inside.setdefault(k, []).append(v)
    return (", ".join(f"{k} {statistics.median(v) * 1000:.1f} ms" for k, v in parts.items()) + "\n    in it: "
            + ", ".join(f"{k} {statistics.median(v) * 1000:.1f} ms" for k, v in inside.items()))


def main() -> None:
    venv = sys.prefix
    tool, env = tool_venv(W)
    builds = {"own": tool}
    if os.environ.get("WHEELS_OLD"):
        old = f"{W}/old"
        subprocess.run(f"{sys.executable} -m venv --without-pip {old} && /tmp/site/bin/uv pip install -q --offline "
                       f"--no-index --no-deps --compile-bytecode --python {old}/bin/python "
                       f"{os.environ['WHEELS_OLD']}/*.whl", shell=True, check=True)
        builds["old"] = old
    inv = dict(env, PYTHONPATH="/tmp/site")
    say(f"snap: {run([f'{tool}/bin/envvault', 'snap', '--venv', venv, '--no-caches', '-m', 'full'], env):.2f} s")
    commands = {"second snap": ["snap", "--venv", venv, "-m", "again"],
                "second snap --no-caches": ["snap", "--venv", venv, "--no-caches", "-m", "again"],
                "status": ["status", "--venv", venv, "--exit-code"],
                "lock-only": ["snap", "--venv", venv, "--lock-only", "-m", "lo"]}
    rows: dict[str, tuple[list[str], dict]] = {
        "pip freeze": ([sys.executable, "-m", "pip", "freeze"], env),
        "uv pip freeze": (["/tmp/site/bin/uv", "pip", "freeze", "--python", sys.executable], env),
        "python -c pass (own venv)": ([f"{tool}/bin/python", "-c", "pass"], env),
        "python -c pass (the venv)": ([sys.executable, "-c", "pass"], inv),
        "python -I -S -c pass (own venv)": ([f"{tool}/bin/python", "-I", "-S", "-c", "pass"], env),
    }
    for name, args in commands.items():
        py = f"{tool}/bin/python"
        run([f"{tool}/bin/envvault"] + args, env)  # once first: what the measured rounds import (a warm cache)
        rows[f"{name}: its imports alone (own venv)"] = ([py, "-c", imports_of([py, "-m", "envvault"] + args, env)],
                                                        env)
        for build, where in builds.items():
            rows[f"{name} ({build} venv)"] = ([f"{where}/bin/envvault"] + args, env)
        rows[f"{name} (the venv)"] = ([sys.executable, "/tmp/site/bin/envvault"] + args, inv)
    walls: dict[str, list[float]] = {k: [] for k in rows}
    for i in range(9):
        names = list(rows)
        for name in names[i % len(names):] + names[:i % len(names)]:
            walls[name].append(run(*rows[name]))
    for name, ws in walls.items():
        say(f"{name}: median {statistics.median(ws) * 1000:.1f} ms ({min(ws) * 1000:.1f}-{max(ws) * 1000:.1f})")
    py = f"{tool}/bin/python"
    for name, args in commands.items():
        say(f"--- {name}: where the wall goes (own venv, medians of 9) " + breakdown(py, args, env))
    for name, args in commands.items():
        p = subprocess.run([f"{tool}/bin/envvault"] + args, capture_output=True, text=True,
                           env=dict(env, ENVVAULT_STAGES="1"))
        say(f"--- {name}: stages\n{p.stderr.strip()}")
        p = subprocess.run([py, "-X", "importtime", "-m", "envvault"] + args, capture_output=True, text=True, env=env)
        top = sorted((ln for ln in p.stderr.splitlines() if ln.startswith("import time:") and "self" not in ln),
                     key=lambda ln: -int(ln.split("|")[1]))[:30]
        say(f"--- {name}: slowest imports (cumulative)\n" + "\n".join(top))
        p = subprocess.run([py, "-m", "cProfile", "-s", "tottime", "-m", "envvault"] + args, capture_output=True,
                           text=True, env=env)
        say(f"--- {name}: cProfile\n" + "\n".join(p.stdout.splitlines()[:40]))
    with open(os.path.join(OUT, "gpu_startup_own.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
