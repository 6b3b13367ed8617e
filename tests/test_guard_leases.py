"""Guard leases (docs/format.md, "Guard leases"): in a vault whose lock is lock objects, a running guard's
"before" snapshot is named in ``locks/lease-<32 hex>.json``, so a ``gc --keep-last`` on another node (its own
machine-local guard locks: it cannot see this node's) keeps what that guard's rollback needs. Before leases,
a gc on node B of a bucket vault deleted node A's running guard's snapshot and A's rollback failed.

The bucket is a real S3 server (moto) on 127.0.0.1; two nodes are two cache folders (each its own
machine-local state, as two hosts have). The lease rules (stale by age, by a dead process of this host;
hostile lease objects; the cap) are checked on a local vault with ``lock = "objects"``, whose ``locks/`` is a
folder the test can age and fill."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envvault.errors import CorruptError, EnvvaultError
from envvault.vault import lockobjects
from envvault.vault.gc import collect_garbage, guarded_snapshots
from envvault.vault.local_locks import DirLockKeys
from envvault.vault.store import Vault
from evtools import ev, ev_env, gc_keeping_none, s3_node
from fixtures import catalogue as C
from fixtures import site_packages, uv_install

SID = "ab" * 32  # an id no snapshot has: a lease may name anything; gc only keeps what it names


def test_a_gc_on_another_node_keeps_a_running_guards_snapshot(s3_server, tmp_path, make_venv, wheelhouse):
    """Node A guards a venv; its command has node B run ``gc --keep-last 0`` on the same bucket, deletes a file
    and fails. B's gc keeps A's "before" snapshot (A's lease names it) and reports it; A's rollback puts the
    file back byte for byte; no lease is left in the bucket once A's guard ends."""
    bucket = s3_server.bucket()
    url = f"s3://{bucket}/team/vault"
    a, b = s3_node(s3_server, tmp_path, "a", url), s3_node(s3_server, tmp_path, "b", url)
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    victim = sorted(p for p in site_packages(venv).rglob("*.py") if ".dist-info" not in str(p))[0]
    kept = victim.read_bytes()
    report = tmp_path / "gc.json"
    script = (f"import os, pathlib, subprocess, sys\n{gc_keeping_none(report, env=b)}\n"
              f"os.unlink({str(victim)!r}); sys.exit(1)\n")
    proc = ev(Path("."), "guard", "--venv", venv, "--yes", "--json", "--", sys.executable, "-c", script,
              env=a, check=False)
    doc = json.loads(proc.stdout)
    gc = json.loads(report.read_text())
    assert doc["before"] in gc["kept_for_guards"], gc
    assert doc["before"] not in gc["removed_snapshots"], gc
    assert proc.returncode == 1 and doc["outcome"] == "restored", proc.stderr
    assert victim.read_bytes() == kept
    assert not [k for k in s3_server.keys(bucket) if "/locks/lease-" in k], "the lease is deleted at the end"


@pytest.fixture
def objects_vault(tmp_path: Path) -> Vault:
    vault = Vault.open(tmp_path / "vault", create=True)
    vault.save_settings({"lock": "objects"})
    return Vault.open(tmp_path / "vault")


def _lease_file(vault: Vault, body: object, *, age: float = 0.0, name: str | None = None) -> Path:
    path = vault.backend.root / "locks" / (name or f"lease-{os.urandom(16).hex()}.json")
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(body if isinstance(body, bytes) else json.dumps(body).encode())
    if age:
        then = time.time() - age
        os.utime(path, (then, then))
    return path


def _body(sid: str = SID, **kw) -> dict:
    return dict({"lock": "lease", "snapshot": sid, "venv": "/x", "hostname": "elsewhere", "pid": 1}, **kw)


def test_lease_rules_live_stale_dead_and_hostile(objects_vault: Vault, tmp_path: Path):
    """Live: a fresh lease of another host, and one of this host's name in another PID namespace. Stale, and
    deleted by the lister: one last written more than 30 minutes before the lister's own vault lock object,
    and one of this host, boot and PID namespace whose process is gone. Pinning
    nothing and never followed: garbage, a lease naming no id, a folder, a symlink to a lease elsewhere, a FIFO
    and a file past 64 KiB; a dry run deletes nothing."""

    other, third = "cd" * 32, "ef" * 32
    live = _lease_file(objects_vault, _body())
    old = _lease_file(objects_vault, _body(other), age=lockobjects.LOCK_STALE_SECONDS + 120)
    dead_proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                               text=True, check=True)
    here = lockobjects._place()
    dead = _lease_file(objects_vault, _body(other, **here, pid=int(dead_proc.stdout)))
    # The same pid in another PID namespace of this host (Docker --network host, hostNetwork pods): not gone.
    elsewhere = _lease_file(objects_vault, _body(third, **dict(here, pidns="pid:[1]"), pid=int(dead_proc.stdout)))
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps(_body(other)))
    (objects_vault.backend.root / "locks" / f"lease-{'e' * 32}.json").symlink_to(outside)
    os.mkfifo(objects_vault.backend.root / "locks" / f"lease-{'f' * 32}.json")
    (objects_vault.backend.root / "locks" / f"lease-{'1' * 32}.json").mkdir()
    for bad in (b"\xff not json", b"[]", json.dumps(_body("nothex")).encode(),
                json.dumps(dict(_body(other), lock="vault")).encode(),
                json.dumps(dict(_body(other), pad="x" * (70 << 10))).encode()):
        _lease_file(objects_vault, bad)
    with objects_vault.lock(exclusive=True):  # gc's position: its own lock object is the clock
        assert guarded_snapshots(objects_vault, clean=False) >= {SID}
        assert old.exists() and dead.exists(), "a dry run deletes nothing"
        pinned = guarded_snapshots(objects_vault)
    assert SID in pinned and third in pinned and other not in pinned, pinned
    assert live.exists() and elsewhere.exists() and not old.exists() and not dead.exists()
    assert outside.exists(), "a link's target is never touched"


def test_a_gc_keeps_a_leased_snapshot_and_reports_it(objects_vault: Vault, tmp_path: Path, make_venv, wheelhouse):
    """A leased snapshot stays through ``gc --keep-last 0`` and guard retention, as a tagged one does; the lease
    of a dead process on this host keeps nothing."""
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    home = objects_vault.backend.root
    first = json.loads(ev(home, "snap", "--no-caches", "--venv", venv, "--json").stdout)["id"]
    (site_packages(venv) / "extra.txt").write_text("x")
    second = json.loads(ev(home, "snap", "--no-caches", "--venv", venv, "--json").stdout)["id"]
    _lease_file(objects_vault, _body(first))
    result = collect_garbage(Vault.open(home), keep_last=0)
    assert first in result.kept_for_guards and first not in result.removed_snapshots
    assert second in result.removed_snapshots
    for path in (home / "locks").glob("lease-*.json"):
        path.write_text(json.dumps(_body(first, **lockobjects._place(), pid=2 ** 22 + 7)))
    result = collect_garbage(Vault.open(home), keep_last=0)
    assert first in result.removed_snapshots and not result.kept_for_guards


def test_guard_retention_keeps_a_leased_snapshot(objects_vault: Vault, make_venv, wheelhouse):
    """Guard retention forgets the oldest automatic snapshots of a path; one that a guard on another node still
    needs (its lease) stays."""
    from envvault.guard.retention import apply_retention

    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    home = objects_vault.backend.root
    ids = []
    for n in range(3):
        (site_packages(venv) / "extra.txt").write_text(str(n))
        done = ev(home, "guard", "--venv", venv, "--yes", "--json", "--", "true")
        ids.append(json.loads(done.stdout)["before"])
    assert not list((home / "locks").glob("lease-*.json")), "each guard deleted its lease"
    _lease_file(objects_vault, _body(ids[0]))
    result = apply_retention(Vault.open(home), venv, keep=1, slack=0, gc=False)
    assert result.forgotten and ids[0] not in result.forgotten, result
    assert ids[0] in {s.id for s in Vault.open(home).snapshots()}


def test_too_many_fresh_leases_stop_gc_before_it_reads_them(objects_vault: Vault, monkeypatch):
    """Each lease is a request: fresh lease objects past the cap stop gc before any is read, junk included
    (3,000 junk objects made a gc hold the exclusive lock for 10 s on moto, helper 28 F3)."""
    monkeypatch.setattr(lockobjects, "MAX_LEASES", 3)
    for n in range(5):
        _lease_file(objects_vault, b"x")
    read = []
    monkeypatch.setattr(DirLockKeys, "get_key", lambda self, key, limit: read.append(key))
    with pytest.raises(CorruptError, match="guard leases"):
        collect_garbage(objects_vault, keep_last=0)
    assert not [k for k in read if "lease-" in k]


def test_an_unreadable_lease_stops_gc_and_skips_retention_with_one_line(objects_vault: Vault, tmp_path,
                                                                        make_venv, wheelhouse):
    """A lease that cannot be read (another user's, mode 000) keeps an unknown snapshot: gc stops with a line
    naming it (exit 6, "cannot read"), and a guard whose retention meets it reports its own outcome with
    "retention skipped" (it exited 6 with no JSON, helper 28 F2)."""
    if os.geteuid() == 0:  # root reads a mode-000 file: a stand-in get_key fails as the read would
        from envvault.errors import StorageError

        def refuse(self, key, limit):
            if "lease-" in key:
                raise StorageError(f"cannot read {key}: Permission denied")
            return None

        patch = pytest.MonkeyPatch()
        patch.setattr(DirLockKeys, "get_key", refuse)
    else:
        patch = None
    bad = _lease_file(objects_vault, _body())
    bad.chmod(0)
    try:
        with pytest.raises(Exception, match="cannot read the guard lease locks/lease-") as err:
            collect_garbage(Vault.open(objects_vault.backend.root), keep_last=0)
        assert getattr(err.value, "exit_code", None) == 6
        from envvault.guard.retention import apply_retention

        venv = make_venv("uv")
        uv_install(venv, wheelhouse[C.SMALL_01])
        home = objects_vault.backend.root
        for n in range(3):
            (site_packages(venv) / "extra.txt").write_text(str(n))
            ev(home, "guard", "--venv", venv, "--yes", "--", "true")
        with pytest.raises(EnvvaultError, match="cannot read the guard lease"):  # guard's _retain: "retention skipped"
            apply_retention(Vault.open(home), venv, keep=1, slack=0, gc=False)
    finally:
        if patch is not None:
            patch.undo()
        bad.chmod(0o644)


def test_a_lease_is_rewritten_while_held_and_written_again_when_a_peer_removed_it(objects_vault: Vault):
    """A guarded command may run for hours: its lease is rewritten every few minutes (here 0.05 s), and one a
    peer deleted as stale (a frozen guard) comes back; it is gone once the guard ends."""
    keys = DirLockKeys(objects_vault.backend.root)
    folder = objects_vault.backend.root / "locks"
    with lockobjects.lease(keys, SID, "/venv", refresh=0.05):
        (path,) = folder.glob("lease-*.json")
        first = path.stat().st_mtime_ns
        os.utime(path, ns=(first - 10 ** 9, first - 10 ** 9))
        deadline = time.monotonic() + 30
        while path.stat().st_mtime_ns <= first - 10 ** 9:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert lockobjects.parse_lease(path.read_bytes()).snapshot == SID
        path.unlink()
        while not path.exists():
            assert time.monotonic() < deadline
            time.sleep(0.02)
    assert not list(folder.glob("lease-*.json"))


def test_a_guard_whose_lease_cannot_be_written_stops_before_its_command(objects_vault, tmp_path, make_venv,
                                                                        wheelhouse):
    """The lease write fails (here made to, in the guard's own process, through ``sitecustomize``): guard
    stops with one line (exit 6) saying the command was not run, and it was not; no lease is left."""
    from tests.evtools import ROOT

    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(
        "from envvault.errors import StorageError\n"
        "from envvault.vault import lockobjects\n"
        "real = lockobjects._put_lock\n"
        "def put(keys, key, body):\n"
        "    if 'lease-' in key:\n"
        "        raise StorageError('writing ' + key + ' failed after 5 attempts')\n"
        "    return real(keys, key, body)\n"
        "lockobjects._put_lock = put\n")
    ran = tmp_path / "ran"
    home = objects_vault.backend.root
    env = ev_env(home, PYTHONPATH=f"{inject}{os.pathsep}{ROOT}")
    proc = ev(home, "guard", "--venv", venv, "--yes", "--", sys.executable, "-c",
              f"import pathlib; pathlib.Path({str(ran)!r}).touch()", env=env, check=False)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("envvault: error:")]
    assert proc.returncode == 6 and "Traceback" not in proc.stderr, proc
    assert len(errors) == 1 and "guard stopped before running the command" in errors[0], proc.stderr
    assert not ran.exists()
    assert not list((home / "locks").glob("lease-*.json"))
