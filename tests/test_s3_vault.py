"""Every command on a vault in a bucket (a real S3 server, moto, on 127.0.0.1), two "nodes" simulated by two
cache folders; sync both ways; many writers and gc at once; a writer killed mid-upload; a network that fails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from evtools import behind_a_gc, ev, ev_json, gc_keeping_none, s3_node
from fixtures import catalogue as C
from fixtures import uv_install, uv_pip
from s3server import FaultProxy


@pytest.fixture
def bucket(s3_server):
    return s3_server.bucket()


node = s3_node  # one node's environment: its own cache, so its own machine-local state


def run(env: dict, *args, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return ev(Path(env.get("ENVVAULT_HOME", ".")), *args, env=env, check=check, **kw)


def jrun(env: dict, *args, **kw) -> dict:
    return json.loads(run(env, *args, "--json", **kw).stdout)


def test_commands_on_a_bucket(s3_server, bucket, tmp_path, make_venv, wheelhouse):
    url = f"s3://{bucket}/team/vault"
    a, b = node(s3_server, tmp_path, "a", url), node(s3_server, tmp_path, "b", url)
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.TORCH_CU128], wheelhouse[C.SMALL_01])
    first = jrun(a, "snap", "--no-caches", "--venv", venv, "-m", "first")["id"]
    uv_pip(venv, "uninstall", "smallpkg")
    second = jrun(a, "snap", "--no-caches", "--venv", venv)["id"]
    assert not (tmp_path / "s3:").exists() and not Path("s3:").exists()
    keys = s3_server.keys(bucket)
    assert "team/vault/config.json" in keys
    assert f"team/vault/snapshots/{first}.json" in keys and f"team/vault/snapshots/{second}.json" in keys
    assert any(k.startswith("team/vault/packs/") and k.endswith(".pack") for k in keys)
    assert not any("/locks/" in k for k in keys), "lock objects are removed when released"

    # node B: nothing cached, sees everything
    listed = jrun(b, "list")["snapshots"]
    assert [s["id"] for s in listed] == [second, first]
    assert jrun(b, "show", first[:10])["id"] == first
    diff = jrun(b, "diff", first, second)
    assert "smallpkg" in json.dumps(diff)
    # restore in place on node B (its own journal lock and markers), export from the bucket
    out = run(b, "restore", first, "--venv", venv)
    assert "verified" in out.stdout, out.stdout + out.stderr
    assert list(Path(venv).glob("lib/python3*/site-packages/smallpkg*"))
    st = jrun(b, "status", "--venv", venv)
    assert st["snapshot"] == first and st["empty"], st
    run(b, "export", first, "-o", tmp_path / "export" / "pylock.toml")
    assert (tmp_path / "export" / "pylock.toml").is_file()
    assert list((tmp_path / "export").rglob("*.whl"))
    uv_pip(venv, "uninstall", "smallpkg")
    run(b, "tag", first, "known-good")
    assert jrun(a, "list")["snapshots"][-1]["tags"] == ["known-good"]
    assert "ok" in run(b, "verify").stdout
    res = jrun(b, "gc")
    assert res["removed_snapshots"] == [] and res["kept_snapshots"] == 3  # first, second, the restore's backup
    run(b, "untag", "known-good")
    res = jrun(a, "gc", "--keep-last", "1")
    assert first in res["removed_snapshots"] and len(res["removed_snapshots"]) == 2
    kept = [s["id"] for s in jrun(b, "list", "--all")["snapshots"]]
    assert len(kept) == 1 and first not in kept
    assert "ok" in run(a, "verify").stdout
    assert not [k for k in s3_server.keys(bucket) if k.endswith(f"{first}.json")]


def test_second_read_on_a_node_is_local(s3_server, bucket, tmp_path, make_venv, wheelhouse):
    """Node B's first verify fetches packs into its cache; its second reads no pack remotely."""
    url = f"s3://{bucket}/v"
    a, b = node(s3_server, tmp_path, "a", url), node(s3_server, tmp_path, "b", url)
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.TORCH_CU128])
    jrun(a, "snap", "--no-caches", "--venv", venv)
    run(b, "verify", "--read-data")
    cache = next((tmp_path / "cache-b" / "vaults").iterdir()) / "objects"
    packs = list((cache / "packs").rglob("*"))
    assert [p for p in packs if p.is_file()], "node B cached the packs it read"
    mtimes = {p: p.stat().st_mtime_ns for p in packs if p.is_file()}
    # Make the bucket refuse every pack read: node B must still verify from its cache.
    proxy = FaultProxy(s3_server.port, rate=0.0)
    proxy.refuse = b".pack HTTP/1.1"
    try:
        b2 = node(s3_server, tmp_path, "b", url, endpoint=proxy.url)
        out = run(b2, "verify", "--read-data")
        assert "ok" in out.stdout
        assert proxy.counts["refused"] == 0 and proxy.counts["connections"] > 0
        # and an empty cache (node C) does read packs through it, so the check above can fail
        c = node(s3_server, tmp_path, "c", url, endpoint=proxy.url)
        assert run(c | {"ENVVAULT_S3_RETRIES": "1"}, "verify", "--read-data", check=False).returncode != 0
        assert proxy.counts["refused"] > 0
    finally:
        proxy.close()
    assert all(p.exists() for p in mtimes)


def test_sync_both_ways(s3_server, bucket, tmp_path, make_venv, wheelhouse):
    local = tmp_path / "local-vault"
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.TORCH_CU128], wheelhouse[C.SMALL_01])
    sid = ev_json(local, "snap", "--no-caches", "--venv", venv)["id"]
    ev(local, "tag", sid, "release")
    url = f"s3://{bucket}/mirror"
    a = node(s3_server, tmp_path, "a", url)
    dry = jrun(a, "sync", "--dry-run", str(local), url)
    assert dry["snapshots"] == 1 and dry["packs"] >= 1
    assert not [k for k in s3_server.keys(bucket) if k.startswith("mirror/")], "a dry run writes nothing"
    push = jrun(a, "sync", str(local), url)
    assert push["snapshots"] == 1 and push["packs"] == dry["packs"] and push["tags"] == 1
    again = jrun(a, "sync", str(local), url)
    assert (again["snapshots"], again["packs"], again["index_files"], again["tags"]) == (0, 0, 0, 0)
    assert again["snapshots_already_there"] == 1
    assert jrun(a, "list")["snapshots"][0]["id"] == sid
    assert "ok" in run(a, "verify").stdout
    # the same bytes under the same names
    for p in (local / "packs").rglob("*.pack"):
        assert f"mirror/packs/{p.parent.name}/{p.name}" in s3_server.keys(bucket)
    # a second snapshot made on the bucket comes back with a pull
    uv_pip(venv, "uninstall", "smallpkg")
    sid2 = jrun(a, "snap", "--no-caches", "--venv", venv)["id"]
    pulled = tmp_path / "pulled"
    pull = jrun(a, "sync", url, str(pulled))
    assert pull["snapshots"] == 2 and pull["tags"] == 1
    back = jrun(a, "sync", url, str(local))
    assert back["snapshots"] == 1 and back["snapshots_already_there"] == 1
    ids = {s["id"] for s in ev_json(local, "list")["snapshots"]}
    assert ids == {sid, sid2}
    assert "ok" in ev(local, "verify").stdout and "ok" in ev(pulled, "verify").stdout


def test_concurrent_snaps_and_gc(s3_server, bucket, tmp_path, make_venv, wheelhouse):
    """4 "nodes" snap 4 environments into one bucket while gc runs on a fifth: every committed snapshot is
    complete afterwards, no referenced object missing."""
    url = f"s3://{bucket}/busy"
    venvs = []
    for i, wheel in enumerate([C.TORCH_CU128, C.SMALL_01, C.TORCH_CU130, C.NS_ALPHA]):
        v = make_venv("uv", name=f"v{i}")
        uv_install(v, wheelhouse[wheel])
        venvs.append(v)
    # a snapshot to forget, so gc has work
    g = node(s3_server, tmp_path, "gc", url)
    jrun(g, "snap", "--no-caches", "--venv", venvs[0])
    procs = [subprocess.Popen([sys.executable, "-m", "envvault", "snap", "--no-caches", "--venv", str(v), "--json"],
                              env=node(s3_server, tmp_path, f"n{i}", url), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i, v in enumerate(venvs)]
    gcs = 0
    while any(p.poll() is None for p in procs) or gcs < 2:
        run(g, "gc", "--keep-last", "1")
        gcs += 1
    ids = []
    for p in procs:
        out, err = p.communicate()
        assert p.returncode == 0, err
        ids.append(json.loads(out)["id"])
    listed = {s["id"] for s in jrun(g, "list", "--all")["snapshots"]}
    assert set(ids) <= listed
    out = run(g, "verify")
    assert "ok" in out.stdout, out.stdout + out.stderr
    assert not [k for k in s3_server.keys(bucket) if "/locks/" in k]


def test_kill_mid_upload_then_verify_and_finish(s3_server, bucket, tmp_path, make_venv, wheelhouse):
    """A snap killed (SIGKILL) right after a pack reached the bucket, before its index and the snapshot: the
    vault verifies clean, the dead writer's lock object does not block, and the next snap finishes."""
    url = f"s3://{bucket}/killed"
    a = node(s3_server, tmp_path, "a", url)
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.TORCH_CU128], wheelhouse[C.SMALL_01])
    proc = run(a | {"ENVVAULT_TEST_CRASH_AT": "pack_renamed"}, "snap", "--no-caches", "--venv", venv, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    keys = s3_server.keys(bucket)
    assert any(k.endswith(".pack") for k in keys) and not any("/snapshots/" in k for k in keys)
    assert any("/locks/" in k for k in keys), "the killed writer left its lock object"
    assert jrun(a, "list")["snapshots"] == []
    assert run(a, "verify").returncode == 0
    sid = jrun(a, "snap", "--no-caches", "--venv", venv)["id"]
    res = jrun(a, "gc")  # takes the exclusive lock past the dead writer's object (same host, pid gone)
    assert res["kept_snapshots"] == 1
    assert "ok" in run(a, "verify").stdout
    assert jrun(node(s3_server, tmp_path, "b", url), "show", sid)["id"] == sid
    assert not [k for k in s3_server.keys(bucket) if "/locks/" in k]


def test_faulty_network(s3_server, bucket, tmp_path, make_venv, wheelhouse):
    """A proxy that answers 500 or cuts the connection on a fifth of the connections: snap, list and verify
    on a node with an empty cache all succeed (retries with backoff), and leave a clean vault."""
    url = f"s3://{bucket}/faulty"
    proxy = FaultProxy(s3_server.port, rate=0.2, seed=7)
    try:
        venv = make_venv("uv")
        uv_install(venv, wheelhouse[C.TORCH_CU128], wheelhouse[C.SMALL_01])
        a = node(s3_server, tmp_path, "a", url, endpoint=proxy.url)
        sid = jrun(a, "snap", "--no-caches", "--venv", venv)["id"]
        b = node(s3_server, tmp_path, "b", url, endpoint=proxy.url)
        assert [s["id"] for s in jrun(b, "list")["snapshots"]] == [sid]
        assert "ok" in run(b, "verify").stdout
        c = node(s3_server, tmp_path, "c", url, endpoint=proxy.url)  # restore on a node with an empty cache
        out = run(c, "restore", sid, "--into", tmp_path / "restored")
        assert "verified" in out.stdout, out.stdout + out.stderr
        assert proxy.counts["500"] + proxy.counts["cut"] > 0, proxy.counts
    finally:
        proxy.close()
    clean = node(s3_server, tmp_path, "d", url)
    assert "ok" in run(clean, "verify").stdout


def test_missing_bucket_and_wrong_credentials(s3_server, tmp_path):
    env = node(s3_server, tmp_path, "a", f"s3://no-such-bucket-{os.getpid()}/v")
    proc = run(env, "list", check=False)
    assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    proc = run(env, "snap", "--no-caches", "--venv", sys.prefix, check=False)
    assert proc.returncode == 6 and "bucket does not exist" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    proxy = FaultProxy(s3_server.port)
    proxy.forbid = True
    try:
        env = node(s3_server, tmp_path, "a", f"s3://{s3_server.bucket()}/v", endpoint=proxy.url)
        proc = run(env, "list", check=False)
        assert proc.returncode == 6 and "access denied" in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    finally:
        proxy.close()


def test_a_stamped_checkpoint_finds_its_bucket_on_another_node(s3_server, bucket, tmp_path, make_venv,
                                                               wheelhouse):
    """The stamp carries the vault's URL (no credentials): on node B, without --vault or ENVVAULT_HOME,
    `envvault restore step_690.pt` and `envvault diff step_690.pt ...` open that bucket."""
    import torch

    url = f"s3://{bucket}/stamped"
    a = node(s3_server, tmp_path, "a", url)
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    sid = jrun(a, "snap", "--no-caches", "--venv", venv)["id"]
    ckpt = tmp_path / "step_690.pt"
    torch.save({"w": torch.zeros(2), "envvault": {"format": 1, "snapshot": sid, "vault": url, "host": "node-a",
                                                  "torch": "2.13.0"}}, ckpt)
    b = node(s3_server, tmp_path, "b", url)
    b.pop("ENVVAULT_HOME")
    out = jrun(b, "restore", ckpt, "--into", tmp_path / "fresh", "--dry-run")
    assert out["restored"] == sid, out
    diffed = run(b, "diff", ckpt, sid)
    assert "no differences" in diffed.stdout
    assert f"using the vault the checkpoint's stamp names, {url}" in diffed.stderr  # said, never silent
    # with --vault naming another vault, the stamp does not override it
    proc = run(b, "--vault", str(tmp_path / "elsewhere"), "restore", ckpt, "--into", tmp_path / "x", "--dry-run",
               check=False)
    assert proc.returncode == 4 and "no vault at" in proc.stderr, proc.stderr


def test_verify_checks_structure_and_reads_data_on_request(s3_server, bucket, tmp_path, make_venv, wheelhouse):
    """Default verify reads the manifests and lists the packs; --read-data reads every frame; a lost pack
    fails both (exit 5, the snapshot named)."""
    url = f"s3://{bucket}/v"
    a = node(s3_server, tmp_path, "a", url)
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.TORCH_CU128])
    sid = jrun(a, "snap", "--no-caches", "--venv", venv)["id"]
    plain = jrun(node(s3_server, tmp_path, "b", url), "verify")
    full = jrun(node(s3_server, tmp_path, "c", url), "verify", "--read-data")
    assert plain["ok"] and full["ok"] and not plain["read_data"] and full["read_data"]
    assert plain["objects"] == full["objects"] and plain["bytes"] < full["bytes"]
    packs = [k for k in s3_server.keys(bucket, "v/packs/") if k.endswith(".pack")]
    s3_server.delete(bucket, packs[0])
    for name, args in (("d", ()), ("e", ("--read-data",))):
        proc = run(node(s3_server, tmp_path, name, url), "verify", "--json", *args, check=False)
        report = json.loads(proc.stdout)
        assert proc.returncode == 5 and not report["ok"] and report["problems"]
        assert all(p["snapshots"] == [sid] for p in report["problems"])



def test_a_snap_behind_a_gc_on_another_node_says_it_waits(s3_server, bucket, tmp_path, make_venv, wheelhouse):
    """The vault lock of a bucket is lock objects: a real process on node A holds it exclusively (as a gc does)
    and a snap on node B says on stderr that it waits (a non-blocking try, then the note, then the blocking
    wait), goes on once the holder lets go, and leaves no lock object behind."""
    url = f"s3://{bucket}/team/vault"
    a, b = node(s3_server, tmp_path, "a", url), node(s3_server, tmp_path, "b", url)
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    jrun(a, "snap", "--no-caches", "--venv", venv)
    code, out, err = behind_a_gc(url, ["snap", "--no-caches", "--venv", venv], keep_last=None, env=b, holder_env=a)
    assert code == 0, err
    assert "Traceback" not in err and out.startswith("snapshot ")
    assert not any("/locks/" in k for k in s3_server.keys(bucket))


def test_a_snap_that_waited_for_a_gc_on_another_node_stores_what_it_deleted(s3_server, bucket, tmp_path, make_venv,
                                                                              wheelhouse):
    """Node B's snap loads its stat cache, then waits while node A's gc (a real process holding the bucket's
    lock objects exclusively, running gc's own code) drops every snapshot and object. Once B holds the lock it
    follows the bucket's gc epoch (its node's stat caches forgotten, in memory too) and stores the files again:
    the snapshot it commits verifies. (A bucket vault stored them again before the in-memory forgetting too:
    this is the local vault's test in tests/test_gc.py, kept for the bucket's own path.)"""
    url = f"s3://{bucket}/team/vault"
    a, b = node(s3_server, tmp_path, "a", url), node(s3_server, tmp_path, "b", url)
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    first = jrun(b, "snap", "--no-caches", "--venv", venv)["id"]
    code, out, err = behind_a_gc(url, ["snap", "--no-caches", "--venv", venv, "--json"], env=b, holder_env=a)
    assert code == 0, err
    second = json.loads(out)
    assert second["new_bytes"] > 0 and second["id"] != first
    assert [s["id"] for s in jrun(a, "list", "--all")["snapshots"]] == [second["id"]]  # the gc dropped the first
    assert jrun(a, "verify")["ok"]
    assert jrun(b, "status", "--venv", venv)["empty"]
    # B followed a gc that ended: its local epoch is a plain one (a running value there would make every
    # command of B list the index again, as after a gc killed part way).
    epochs = list((tmp_path / "cache-b").rglob("state/gc-epoch"))
    assert len(epochs) == 1 and not epochs[0].read_bytes().rstrip().endswith(b"-running"), epochs


def test_a_gc_keeps_this_machines_running_guard_target_when_another_machine_guards_the_same_path(
        s3_server, bucket, tmp_path, make_venv, wheelhouse):
    """Two machines, one bucket, a venv at the same path on both. Machine A's guarded command: machine B guards
    that path (its own guard, started later), then A runs ``gc --keep-last 0`` and the command fails. gc kept
    the newest guard "before" snapshot of the path, B's, and dropped A's: A's rollback found nothing (exit 4;
    helper 25, F1). gc now keeps the snapshot A's guard named in its lock file."""
    from fixtures import site_packages

    url = f"s3://{bucket}/team/vault"
    a, b = node(s3_server, tmp_path, "a", url), node(s3_server, tmp_path, "b", url)
    venv = make_venv("uv")
    uv_install(venv, wheelhouse[C.SMALL_01])
    victim = sorted(p for p in site_packages(venv).rglob("*.py") if ".dist-info" not in str(p))[0]
    kept = victim.read_bytes()
    jrun(a, "snap", "--no-caches", "--venv", venv)
    ev_cmd = [sys.executable, "-m", "envvault"]
    script = (f"import json, os, pathlib, subprocess, sys\n"
              f"b = subprocess.run({ev_cmd!r} + ['guard', '--venv', {str(venv)!r}, '--yes', '--', 'true'], "
              f"env={b!r}, capture_output=True, text=True)\n"
              f"assert b.returncode == 0, b.stderr\n"
              f"{gc_keeping_none(tmp_path / 'gc.json', env=a)}\n"
              f"os.unlink({str(victim)!r}); sys.exit(1)\n")
    proc = run(a, "guard", "--venv", venv, "--yes", "--json", "--", sys.executable, "-c", script, check=False)
    doc = json.loads(proc.stdout)
    gc = json.loads((tmp_path / "gc.json").read_text())
    assert doc["before"] not in gc["removed_snapshots"], gc
    assert proc.returncode == 1 and doc["outcome"] == "restored", proc.stderr
    assert victim.read_bytes() == kept
