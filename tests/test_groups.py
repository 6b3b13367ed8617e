"""Issue 11: a first snap's small files read, hashed and packed in groups (``envvault/snap/groups.py``), by
forked processes on a host of 8 cores or more, else by the reader that first asks for one of a group's files.
The vault's packs are the same bytes either way, and whatever the number of processes; a child that dies is
made up for here; a file that cannot be read fails the snap at its own turn, as without groups."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

from fixtures import catalogue as C
from fixtures.venvs import pip_install, site_packages
from tests.evtools import alive, ev, ev_env
from tests.test_forked_checks import _fresh

ROOT = Path(__file__).resolve().parent.parent


def _packs(vault: Path) -> list[str]:
    """The names of a vault's pack files (their BLAKE3 ids), which lie in folders by their first two digits."""
    return sorted(p.name for p in (vault / "packs").rglob("*.pack"))


def _row(path: str, size: int | None):
    return SimpleNamespace(path=path, size=size, algo=None, digest=None)


def test_small_groups_take_the_small_files_in_record_order_cut_by_bytes_and_files(monkeypatch):
    from envvault.snap import groups

    builder = SimpleNamespace(absolute=lambda dist, rec: None if rec.path.startswith("../") else f"/e/{rec.path}")
    a = SimpleNamespace(record=[_row("a/one.py", 10), _row("a/__pycache__/one.cpython-311.pyc", 10),
                                _row("a/big.so", 1 << 20), _row("a/empty.py", 0), _row("a/none.py", None),
                                _row("../../bin/tool", 10), _row("a/two.py", 20)])
    b = SimpleNamespace(record=[_row("b/three.py", 30), _row("b/four.py", 40)])
    monkeypatch.setattr(groups, "MIN_BYTES", 100)
    assert groups.small_groups(builder, [a, b]) == [["/e/a/one.py", "/e/a/two.py", "/e/b/three.py", "/e/b/four.py"]]
    monkeypatch.setattr(groups, "GROUP_BYTES", 50)
    assert groups.small_groups(builder, [a, b]) == [["/e/a/one.py", "/e/a/two.py"], ["/e/b/three.py"],
                                                    ["/e/b/four.py"]]
    monkeypatch.setattr(groups, "GROUP_BYTES", 1 << 20)
    monkeypatch.setattr(groups, "GROUP_FILES", 3)
    assert groups.small_groups(builder, [a, b]) == [["/e/a/one.py", "/e/a/two.py", "/e/b/three.py"], ["/e/b/four.py"]]
    monkeypatch.setattr(groups, "MIN_BYTES", 101)  # 100 bytes of small files: no groups at all
    assert groups.small_groups(builder, [a, b]) == []
    monkeypatch.setattr(groups, "MIN_BYTES", 1)  # a file two distributions list (or one twice) is in none
    c = SimpleNamespace(record=[_row("b/three.py", 30), _row("c/five.py", 50), _row("c/five.py", 50)])
    assert groups.small_groups(builder, [a, b, c]) == [["/e/a/one.py", "/e/a/two.py", "/e/b/four.py"]]


def _snap(vault: Path, venv: Path, processes: int) -> tuple[dict, str]:
    env = {**ev_env(vault), "ENVVAULT_GROUP_PROCESSES": str(processes), "ENVVAULT_STAGES": "1"}
    proc = ev(vault, "snap", "--no-caches", "--venv", venv, "--json", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    return json.loads(proc.stdout), proc.stderr


def test_a_real_torch_venv_snaps_to_the_same_packs_in_one_process_and_in_three(tmp_path, torch_venv):
    """A venv made by ``python -m venv`` and pip with real torch 2.13.0+cpu and numpy (212 MiB of small files
    in 16,300: seven groups), snapped by the command with its groups built in this process (one process) and by
    three (two forked children): the same pack files, byte for byte (their names are their BLAKE3 ids), the
    same objects counted as new; every object reads back; status finds nothing changed; a second snap, whose
    stat cache is warm, builds no group."""
    one, err_one = _snap(tmp_path / "one", torch_venv, 1)
    three, err_three = _snap(tmp_path / "three", torch_venv, 3)
    assert "readers: small files in groups (this process)" in err_one and "forked children" not in err_one
    assert "forked children: groups: a group read, hashed, packed" in err_three, err_three[-2000:]
    assert _packs(tmp_path / "one") == _packs(tmp_path / "three")
    assert sorted(os.listdir(tmp_path / "one" / "index")) == sorted(os.listdir(tmp_path / "three" / "index"))
    assert one["new_objects"] == three["new_objects"]  # (new_bytes counts the snapshot document: its time)
    assert one["packages"] == three["packages"]
    for vault in (tmp_path / "one", tmp_path / "three"):
        check = ev(vault, "verify", "--read-data", check=False)
        assert check.returncode == 0, check.stdout + check.stderr
        assert ev(vault, "status", "--venv", torch_venv, "--exit-code", check=False).returncode == 0
    again, err_again = _snap(tmp_path / "three", torch_venv, 3)
    assert "groups" not in err_again and again["new_objects"] <= 3, (again["new_objects"], err_again[-1500:])


def _venv_with_files(make_venv, wheelhouse) -> Path:
    venv = make_venv("venv")
    pip_install(venv, *(str(wheelhouse[k]) for k in (C.TORCH_PLAIN_A, C.SERVING, C.WITH_HEADERS, C.SMALL_01)))
    return venv


_BUILD = """
    from pathlib import Path
    from types import SimpleNamespace
    from envvault.snap import groups as G
    from envvault.vault.statcache import stat_key
    from envvault.vault.store import Vault

    site = Path({site!r})
    files = sorted(str(p) for p in site.rglob("*.py") if "__pycache__" not in p.parts and p.stat().st_size)
    cut = [files[i:i + 2] for i in range(0, len(files), 2)]

    def build(vault_dir, processes):
        vault = Vault.open(Path(vault_dir), create=True)
        groups = G.SmallGroups(vault, cut)
        groups.start(processes)
        digests = {{}}
        for path in files:
            st = os.lstat(path)
            got = groups.digest(path, stat_key(st))
            digests[path] = None if got is None else [got.sha256, got.size, got.chunks]
        count = SimpleNamespace(written_objects=0)
        count.count = lambda nbytes, objects: setattr(count, "written_objects", count.written_objects + objects)
        groups.finish(count)
        return {{"digests": digests, "packs": sorted(p.name for p in (Path(vault_dir) / "packs").rglob("*.pack")),
                "objects": count.written_objects, "indexed": sum(vault.has(c) for d in digests.values() if d
                                                                 for c in d[2])}}
"""


def test_a_child_that_dies_in_its_group_is_made_up_for_with_the_same_packs(tmp_path, make_venv, wheelhouse):
    """Groups of two files built by four forked processes (this one only waits), the child that takes the first
    group SIGKILLed in it: this process builds that group again, and every file's digest, the packs and their objects (all in the
    vault's index afterwards) are those of one process building every group; no child is left behind."""
    venv = _venv_with_files(make_venv, wheelhouse)
    got = _fresh(_BUILD.format(site=str(site_packages(venv))) + f"""
    here = build({str(tmp_path / "here")!r}, 1)
    real = G._build

    def dying(vault, known, group, *rest):
        if os.getpid() != parent and group is cut[0]:
            os.kill(os.getpid(), signal.SIGKILL)
        if os.getpid() != parent:
            note()
        return real(vault, known, group, *rest)

    G._build = dying
    there = build({str(tmp_path / "there")!r}, 4)
    print(json.dumps({{"same": here == there, "forks": len(forks), "by_children": len(noted()),
                      "answered": sum(d is not None for d in there["digests"].values()), "files": len(files),
                      "indexed": there["indexed"], "chunks": sum(len(d[2]) for d in there["digests"].values() if d),
                      "objects": there["objects"], "packs": len(there["packs"]), "left": not no_children_left()}}))
    """)
    assert got["same"] and got["forks"] == 4 and not got["left"], got
    assert got["by_children"] >= 1 and got["answered"] == got["files"] >= 9, got
    assert got["indexed"] == got["chunks"] and got["objects"] >= 1 and got["packs"] >= 2, got


def test_a_fifo_where_a_small_file_was_is_recorded_missing_with_groups(tmp_path, make_venv, wheelhouse):
    """A small file swapped for a FIFO: the snap failed naming it ("not a regular file"); that file is gone, so
    the snap records it missing, never opening the FIFO, whether the groups are built here or by forked
    children (helper 29: status, snap and every restore stopped on it). No temp file is left in the vault's
    state, and each snap wrote its snapshot."""
    venv = _venv_with_files(make_venv, wheelhouse)
    victim = next(p for p in sorted(site_packages(venv).rglob("*.py")) if "servingpkg" in str(p))
    victim.unlink()
    os.mkfifo(victim)
    got = _fresh(f"""
        from pathlib import Path
        from envvault.snap import groups as G, take_snapshot
        from envvault.vault.store import Vault

        G.MIN_BYTES = 1
        G.GROUP_FILES = 4
        out = []
        for processes in (1, 3):
            os.environ["ENVVAULT_GROUP_PROCESSES"] = str(processes)
            root = Path({str(tmp_path)!r}) / f"v{{processes}}"
            vault = Vault.open(root, create=True)
            snap = take_snapshot(vault, Path({str(venv)!r}), argv=["test"]).snapshot
            out.append(sorted(m for p in snap.packages for m in p.missing))
            temps = [n for d in (root / "state").rglob("*") if d.is_dir() for n in os.listdir(d) if n.endswith(".tmp")]
            out.append(len(temps) + len(os.listdir(root / "snapshots")))
        print(json.dumps({{"out": out, "forks": len(forks), "left": not no_children_left()}}))
    """)
    rel = victim.relative_to(venv).as_posix()
    assert got["out"] == [[rel], 1, [rel], 1] and not got["left"], got


def test_an_incremental_snap_builds_no_groups(tmp_path, make_venv, wheelhouse):
    """Only a first snap (an empty stat cache) builds groups: a snap after an edit
    reads the edited file through the pipeline alone."""
    venv = _venv_with_files(make_venv, wheelhouse)
    got = _fresh(f"""
        from pathlib import Path
        from envvault.snap import groups as G, take_snapshot
        from envvault.vault.store import Vault

        G.MIN_BYTES = 1
        made = []
        real = G.SmallGroups.__init__
        G.SmallGroups.__init__ = lambda self, vault, groups, *rest: made.append(len(groups)) or real(self, vault, groups, *rest)
        vault = Vault.open(Path({str(tmp_path / "v")!r}), create=True)
        take_snapshot(vault, Path({str(venv)!r}), argv=["test"])
        first = list(made)
        edited = next(p for p in sorted(Path({str(site_packages(venv))!r}).rglob("*.py")) if "smallpkg" in str(p))
        edited.write_text(edited.read_text() + "# edited\\n")
        take_snapshot(vault, Path({str(venv)!r}), argv=["test"])
        print(json.dumps({{"first": first, "after": made[len(first):]}}))
    """)
    assert len(got["first"]) == 1 and got["first"][0] >= 1 and got["after"] == [], got


def test_a_first_snap_into_a_vault_that_holds_some_of_its_files_makes_the_same_packs(tmp_path, make_venv, wheelhouse):
    """Two venvs with the same wheels, snapped one after the other into one vault: the second's groups leave
    out what the first stored (the index as it was when the snap began), and its packs are the same whether
    its groups are built by the readers, while the pipeline's own packs join the index, or by forked processes
    before it."""
    first = _venv_with_files(make_venv, wheelhouse)
    second = make_venv("uv")
    from fixtures.venvs import uv_install

    uv_install(second, *(str(wheelhouse[k]) for k in (C.TORCH_PLAIN_A, C.SERVING, C.NS_ALPHA)))
    got = {}
    for processes in (1, 3):  # the second snap in an interpreter of its own, as the command runs it
        ev(tmp_path / f"v{processes}", "snap", "--no-caches", "--venv", first)
        got[processes] = _fresh(f"""
            from pathlib import Path
            from envvault.snap import groups as G, take_snapshot
            from envvault.vault.store import Vault

            G.MIN_BYTES = 1
            G.GROUP_FILES = 3
            root = Path({str(tmp_path)!r}) / "v{processes}"
            before = set(os.listdir(root / "index"))
            os.environ["ENVVAULT_GROUP_PROCESSES"] = "{processes}"
            take_snapshot(Vault.open(root), Path({str(second)!r}), argv=["test"])
            print(json.dumps({{"new": sorted(set(os.listdir(root / "index")) - before), "forks": len(forks),
                              "left": not no_children_left()}}))
        """)
    assert got[1]["new"] == got[3]["new"] and len(got[1]["new"]) >= 2, got
    assert got[1]["forks"] == 0 and got[3]["forks"] == 3 and not got[3]["left"], got


def test_ctrl_c_while_children_build_groups_leaves_no_child_and_no_temp_file(tmp_path, make_venv, wheelhouse):
    """Ctrl-C (here SIGALRM raising KeyboardInterrupt) while forked children are in their groups, each holding
    a temp pack: the snap stops with KeyboardInterrupt, every child is killed and reaped, their temp files are
    removed, no snapshot is written; the same snap then runs to the end."""
    venv = _venv_with_files(make_venv, wheelhouse)
    got = _fresh(f"""
        from pathlib import Path
        from envvault.snap import groups as G, take_snapshot
        from envvault.vault.fsutil import tmp_name
        from envvault.vault.store import Vault

        G.MIN_BYTES = 1
        G.GROUP_FILES = 2
        os.environ["ENVVAULT_GROUP_PROCESSES"] = "3"
        root = Path({str(tmp_path / "v")!r})
        vault = Vault.open(root, create=True)
        real = G._build

        def slow(vault, known, group, *rest):
            if os.getpid() != parent:
                open(tmp_name(vault.state.tmp_dir, "pack"), "wb").close()  # as a writer's first pack
                note()
                time.sleep(30)
            return real(vault, known, group, *rest)

        def interrupt(*_):
            raise KeyboardInterrupt

        counting_fork = os.fork

        def fork_then_alarm():  # Ctrl-C half a second after the third child is forked
            pid = counting_fork()
            if pid and len(forks) == 3:
                signal.setitimer(signal.ITIMER_REAL, 0.5)
            return pid

        G._build = slow
        os.fork = fork_then_alarm
        signal.signal(signal.SIGALRM, interrupt)
        out = {{}}
        try:
            take_snapshot(vault, Path({str(venv)!r}), argv=["test"])
            out["stopped"] = False
        except KeyboardInterrupt:
            out["stopped"] = True
        signal.setitimer(signal.ITIMER_REAL, 0)
        tmp = [n for n in os.listdir(vault.state.tmp_dir) if n.endswith(".tmp")]
        out.update(tmp=tmp, snapshots=os.listdir(root / "snapshots"), forks=len(forks),
                   left=not no_children_left(), started=len(noted()))
        print(json.dumps(out))
    """)
    assert got["stopped"] and got["forks"] == 3 and not got["left"], got
    assert got["started"] >= 1 and got["tmp"] == [] and got["snapshots"] == [], got


def test_a_file_two_distributions_list_keeps_the_packs_the_same_for_any_readers_and_processes(tmp_path, make_venv,
                                                                                               wheelhouse):
    """One file listed by two RECORDs (a namespace package's ``__init__.py``, a file one package overwrites in
    another) is in no group: whether the pipeline asks for it twice depends on how far planning runs ahead,
    so a group's answer for it would make the packs depend on the reader threads. With 1 and 2 readers, and
    the groups built by the readers or by 3 forked processes, the packs are the same."""
    venv = _venv_with_files(make_venv, wheelhouse)
    sp = site_packages(venv)
    torch_record = next(sp.glob("torchlike-*.dist-info")) / "RECORD"
    shared = next(ln for ln in torch_record.read_text().splitlines() if ln.startswith("torchlike/__init__.py,"))
    serving_record = next(sp.glob("servingpkg-*.dist-info")) / "RECORD"
    serving_record.write_text(serving_record.read_text() + shared + "\n")
    packs = {}
    for readers, processes in ((1, 1), (2, 1), (2, 3)):
        vault = tmp_path / f"v{readers}{processes}"
        got = _fresh(f"""
            from pathlib import Path
            from envvault.snap import groups as G, take_snapshot
            from envvault.vault.store import Vault

            G.MIN_BYTES = 1
            G.GROUP_FILES = 2
            os.environ.update(ENVVAULT_READERS="{readers}", ENVVAULT_GROUP_PROCESSES="{processes}")
            take_snapshot(Vault.open(Path({str(vault)!r}), create=True), Path({str(venv)!r}), argv=["test"])
            print(json.dumps({{"forks": len(forks)}}))
        """)
        assert got["forks"] == (3 if processes == 3 else 0), got
        packs[(readers, processes)] = _packs(vault)
    assert packs[(1, 1)] == packs[(2, 1)] == packs[(2, 3)] and len(packs[(1, 1)]) >= 3, packs


def test_group_builders_end_with_a_snap_killed_by_sigkill(tmp_path, make_venv, wheelhouse):
    """A snap SIGKILLed (the OOM killer, a job's time limit) while its forked builders are in their groups: they
    end with it (they write packs and hold the vault's lock), not when their group is done."""
    import signal
    import subprocess
    import sys
    import time

    venv = _venv_with_files(make_venv, wheelhouse)
    log = tmp_path / "pids"
    code = f"""
import os, sys, time
from pathlib import Path
from envvault.snap import groups as G, take_snapshot
from envvault.vault.store import Vault
G.MIN_BYTES = 1
G.GROUP_FILES = 2
os.environ["ENVVAULT_GROUP_PROCESSES"] = "3"
parent = os.getpid()
real = G._build
def slow(vault, known, group, *rest):
    if os.getpid() != parent:
        with open({str(log)!r}, "a") as f:
            f.write(f"{{os.getpid()}}\\n")
        time.sleep(60)
    return real(vault, known, group, *rest)
G._build = slow
take_snapshot(Vault.open(Path({str(tmp_path / "v")!r}), create=True), Path({str(venv)!r}), argv=["test"])
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    deadline = time.monotonic() + 60
    while (not log.exists() or len(log.read_text().split()) < 3) and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = [int(p) for p in log.read_text().split()]
    assert len(pids) == 3, pids
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    deadline = time.monotonic() + 10
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(alive, pids)), [p for p in pids if alive(p)]


# A first snap's groups forced (any size), ``files`` a group; ``asked`` gets, for each file of a group whose path
# holds ``which``, whether its group answered the pipeline for it.
_COUNTED = """
        from pathlib import Path
        from envvault.snap import groups as G, take_snapshot
        from envvault.vault.store import Vault

        G.MIN_BYTES = 1
        G.GROUP_FILES = {files}
        real = G.SmallGroups.digest
        out = {{}}

        def counted(self, path, key):
            got = real(self, path, key)
            if path in self.where and {which!r} in path:
                asked.append(got is not None)
            return got

        G.SmallGroups.digest = counted
"""


def test_the_pipeline_takes_every_grouped_files_digest_from_its_group(tmp_path, make_venv, wheelhouse):
    """A first snap with groups (built by the readers, or by 3 forked processes) reads no grouped file a
    second time: every file of a group is answered from it (``SmallGroups.digest`` under the stat key the plan
    found), so the small files' reads, hashes and packs are the groups' alone. A key the pipeline spelled
    differently from the groups' would answer None for each, and the pipeline would read them all again."""
    venv = _venv_with_files(make_venv, wheelhouse)
    got = _fresh(_COUNTED.format(files=3, which="") + f"""
        for processes in (1, 3):
            asked = []
            os.environ["ENVVAULT_GROUP_PROCESSES"] = str(processes)
            made = []
            init = G.SmallGroups.__init__
            G.SmallGroups.__init__ = lambda self, vault, groups, *rest: made.append(sum(map(len, groups))) or init(self, vault, groups, *rest)
            take_snapshot(Vault.open(Path({str(tmp_path)!r}) / f"v{{processes}}", create=True), Path({str(venv)!r}),
                          argv=["test"])
            G.SmallGroups.__init__ = init
            out[processes] = {{"grouped": made, "asked": len(asked), "answered": sum(asked)}}
        print(json.dumps(out))
    """)
    for processes in ("1", "3"):
        run = got[processes]
        assert run["grouped"] and run["grouped"][0] >= 6, got
        assert run["answered"] == run["asked"] == run["grouped"][0], got


def test_no_fork_leaves_the_groups_to_the_readers_and_no_builder_is_forked_without_a_group(tmp_path, make_venv,
                                                                                             wheelhouse):
    """With another thread alive (forking is unsafe), ``start`` builds nothing up front: each group is built
    by the first reader that asks for one of its files, as on fewer than 8 cores. With two groups and eight
    processes asked for, two builders are forked, not eight."""
    venv = _venv_with_files(make_venv, wheelhouse)
    got = _fresh(_BUILD.format(site=str(site_packages(venv))) + f"""
    real = G._build
    built = []
    G._build = lambda vault, known, group, *rest: built.append(os.getpid()) or real(vault, known, group, *rest)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    vault = Vault.open(Path({str(tmp_path / "a")!r}), create=True)
    groups = G.SmallGroups(vault, cut)
    groups.start(3)
    up_front = len(built)
    st = os.lstat(cut[1][0])
    first = groups.digest(cut[1][0], stat_key(st))
    after_one = len(built)
    groups.finish(SimpleNamespace(count=lambda nbytes, objects: None))
    stop.set()
    other.join()
    forks_threaded = len(forks)
    vault2 = Vault.open(Path({str(tmp_path / "b")!r}), create=True)
    two = G.SmallGroups(vault2, cut[:2])
    two.start(8)
    print(json.dumps({{"up_front": up_front, "after_one": after_one, "answered": first is not None,
                      "forks_threaded": forks_threaded, "forks_two": len(forks) - forks_threaded,
                      "left": not no_children_left()}}))
    """)
    assert got["forks_threaded"] == 0 and got["up_front"] == 0 and got["after_one"] == 1 and got["answered"], got
    assert got["forks_two"] == 2 and not got["left"], got


def test_files_linked_into_an_installers_cache_are_read_in_groups_and_only_recorded_bytes_stored(tmp_path, make_venv):
    """A linked install (pdm's, uv's ``--link-mode symlink``): every file a symlink into a cache. The groups left
    every link to the pipeline, which read them all in this process (the GPU host's real venv as pdm links:
    20.8 s against a copied venv's 9.96 s). A group now reads a link as the pipeline does, pinned: the file it
    leads to, exactly RECORD's size and sha256 before a byte is stored, its stat key that file's, so the scan
    takes the group's answer for the very file its plan found. A link to a secret of RECORD's size whose hash
    RECORD does not give stores nothing, in a group or in the pipeline, and a link to a 1 TiB file whose RECORD
    row says 100 bytes is never read (the group read the file it led to whole); with 1 process and with 3."""
    from fixtures import build_wheel, pdm_link_install

    files = {f"linky/m{i}.py": f"X = {i}\n".encode() * (200 + i) for i in range(12)}
    wheel = build_wheel(tmp_path / "wheels", "linky", "1.0", files)
    venv = make_venv("uv")
    dist_info = pdm_link_install(venv, wheel, tmp_path / "cache")
    secret = tmp_path / "id_ed25519"
    secret.write_bytes(b"envvault-test-secret\n" * 40)
    (site_packages(venv) / "linky" / "key.py").symlink_to(secret)
    huge = tmp_path / "huge.bin"  # a link to 1 TiB (sparse) whose RECORD row says 100 bytes: never read
    with open(huge, "wb") as f:
        f.truncate(1 << 40)
    (site_packages(venv) / "linky" / "huge.py").symlink_to(huge)
    record = (dist_info / "RECORD").read_text()
    (dist_info / "RECORD").write_text(record + f"linky/key.py,sha256={'A' * 43},{secret.stat().st_size}\n"
                                      f"linky/huge.py,sha256={'B' * 43},100\n")
    got = _fresh(_COUNTED.format(files=4, which="/linky/m") + f"""
        for processes in (1, 3):
            asked = []
            os.environ["ENVVAULT_GROUP_PROCESSES"] = str(processes)
            vault = Vault.open(Path({str(tmp_path)!r}) / f"v{{processes}}", create=True)
            res = take_snapshot(vault, Path({str(venv)!r}), argv=["test"])
            man = vault.load_manifest(next(p for p in res.snapshot.packages if p.name == "linky").manifest)
            stored = any(b"envvault-test-secret" in bytes(vault.get(oid)) for oid in vault.index())
            out[processes] = {{"asked": len(asked), "answered": sum(asked), "secret": stored,
                              "files": {{f.path.rsplit("/", 1)[-1]: [f.state, f.link is None, f.chunks is not None]
                                        for f in man.files if "/linky/" in f.path}}}}
        print(json.dumps(out))
    """)
    for processes in ("1", "3"):
        run = got[processes]
        assert run["asked"] == run["answered"] == 12, got
        assert not run["secret"], got
        assert run["files"]["key.py"] == ["modified", False, False], got
        assert run["files"]["huge.py"] == ["modified", False, False], got
        assert all(run["files"][f"m{i}.py"] == ["ok", True, True] for i in range(12)), got
