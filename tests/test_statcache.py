"""The stat cache: its ids are trusted without the index, so a gc must invalidate every copy in flight."""

from __future__ import annotations

import os

from fixtures import catalogue as C
from fixtures import uv_install
from tests.evtools import ev, ev_json


def test_cache_loaded_before_gc_is_not_saved_back(tmp_path, make_venv, wheelhouse):
    from envvault.snap import statcache_for
    from envvault.vault.gc import collect_garbage
    from envvault.vault.store import Vault

    venv = make_venv("uv")
    uv_install(venv, str(wheelhouse[C.SMALL_01]))
    vault_dir = tmp_path / "vault"
    ev(vault_dir, "snap", "--venv", venv)
    vault = Vault.open(vault_dir)
    stale = statcache_for(vault, venv)  # a scan loads the cache ...
    assert stale.groups, "the first snap should have left a stat cache"
    collect_garbage(vault)  # ... a gc runs and deletes every stat cache ...
    assert not list((vault_dir / "state").glob("stat-*"))
    stale.mark_dirty()
    stale.save()  # ... and the scan's save must not bring the old ids back
    assert not list((vault_dir / "state").glob("stat-*"))
    # a cache loaded after the gc saves normally
    fresh = statcache_for(vault, venv)
    fresh.extra["probe"] = {"key": [], "value": {}}
    fresh.mark_dirty()
    fresh.save()
    assert list((vault_dir / "state").glob("stat-*.groups.json"))


def test_snap_after_gc_references_only_stored_objects(tmp_path, make_venv, wheelhouse):
    venv = make_venv("uv")
    uv_install(venv, str(wheelhouse[C.SMALL_01]))
    vault = tmp_path / "vault"
    first = ev_json(vault, "snap", "--venv", venv)["id"]
    ev(vault, "gc", "--keep-last", "1")
    uv_install(venv, str(wheelhouse[C.SMALL_02]))
    ev_json(vault, "snap", "--venv", venv)
    ev(vault, "gc", "--keep-last", "1")  # drops the first snapshot and the objects only it used
    assert not (vault / "snapshots" / f"{first}.json").exists()
    uv_install(venv, str(wheelhouse[C.SMALL_01]))  # back to the first state: its objects are gone
    os.sync()
    ev_json(vault, "snap", "--venv", venv)
    assert ev_json(vault, "verify")["ok"]
