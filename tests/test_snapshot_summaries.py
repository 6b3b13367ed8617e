"""Choosing a snapshot without reading them all (issue 11): ``status`` and ``latest`` take the snapshots'
summaries from ``state/snapshot-summaries.json`` (a snapshot never changes under its id), read only new
snapshots, and check the one they pick against the snapshot itself, so a forged cache (a copied vault brings
its ``state/``) changes nothing."""

from __future__ import annotations

import json

import pytest

from envvault.vault.store import Vault
from fixtures.venvs import make_venv
from tests.evtools import ev, ev_json


@pytest.fixture(scope="module")
def two_envs(tmp_path_factory):
    root = tmp_path_factory.mktemp("summaries")
    a, b = make_venv(root / "a"), make_venv(root / "b")
    vault = root / "vault"
    ids = {}
    for name, venv in (("a1", a), ("b1", b), ("a2", a), ("b2", b)):
        ids[name] = ev_json(vault, "snap", "--venv", venv, "--no-caches", "--lock-only", "-m", name)["id"]
    return root, vault, a, b, ids


def _count_loads(monkeypatch) -> list[str]:
    loads: list[str] = []
    real = Vault.load_snapshot
    monkeypatch.setattr(Vault, "load_snapshot", lambda self, sid: (loads.append(sid), real(self, sid))[1])
    return loads


def test_latest_reads_only_the_snapshot_it_picks(two_envs, monkeypatch):
    root, vault_dir, a, b, ids = two_envs
    vault = Vault.open(vault_dir)
    vault.snapshot_summaries()  # the cache is written
    loads = _count_loads(monkeypatch)
    assert vault.resolve("latest", venv=str(a)) == ids["a2"]
    assert vault.resolve("latest") == ids["b2"]
    assert loads == [ids["a2"], ids["b2"]]  # one check each, no other snapshot read
    rows = json.loads((vault_dir / "state" / "snapshot-summaries.json").read_text())
    assert set(rows) == set(ids.values())


def test_a_forged_summary_is_caught_and_the_choice_made_from_the_snapshots(two_envs):
    root, vault_dir, a, b, ids = two_envs
    vault = Vault.open(vault_dir)
    vault.snapshot_summaries()
    path = vault_dir / "state" / "snapshot-summaries.json"
    rows = json.loads(path.read_text())
    rows[ids["b2"]][0] = "2999-01-01T00:00:00Z"  # b's newest claims to be the newest of all ...
    rows[ids["b2"]][1] = str(a)  # ... and of env a
    path.write_text(json.dumps(rows))
    assert Vault.open(vault_dir).resolve("latest", venv=str(a)) == ids["a2"]
    out = ev(vault_dir, "status", "--venv", a, "--json")
    assert json.loads(out.stdout)["snapshot"] == ids["a2"]
    fixed = json.loads(path.read_text())  # the cache was rebuilt from the snapshots
    assert fixed[ids["b2"]][1] == str(b)


def test_damaged_cache_and_deleted_snapshots(two_envs):
    root, vault_dir, a, b, ids = two_envs
    path = vault_dir / "state" / "snapshot-summaries.json"
    path.write_bytes(b"[" * 100_000)  # not a cache this code writes (too deep for json.loads)
    assert Vault.open(vault_dir).resolve("latest", venv=str(b)) == ids["b2"]
    rows = json.loads(path.read_text())
    rows["f" * 64] = rows[ids["a1"]]  # a snapshot that is gone: dropped, never chosen
    rows["f" * 64][0] = "2999-01-01T00:00:00Z"
    path.write_text(json.dumps(rows))
    assert Vault.open(vault_dir).resolve("latest", venv=str(a)) == ids["a2"]
    assert "f" * 64 not in json.loads(path.read_text())
