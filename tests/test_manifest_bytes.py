"""The distribution manifests a scan writes, byte for byte: a hand-made distribution holding every kind of
RECORD row (hashed, edited, missing, another algorithm, no hash, bytecode, symlink, folder, outside the
environment, a script, a launcher) is scanned in the three modes and each manifest must be exactly the stored
one in ``tests/data/manifest_bytes.json`` (written by the dict-building ManifestBuilder before it built
records; ``{site}`` stands for the venv's site-packages path)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

import pytest

from envvault.model.encoding import object_id
from envvault.snap.scan import scan_environment
from envvault.vault.store import Vault
from fixtures.venvs import site_packages

GOLDEN = Path(__file__).parent / "data" / "manifest_bytes.json"


def _row(path: str, data: bytes | None, algo: str = "sha256") -> str:
    if data is None:
        return f"{path},,"
    digest = base64.urlsafe_b64encode(hashlib.new(algo, data).digest()).rstrip(b"=").decode()
    return f"{path},{algo}={digest},{len(data)}"


def handmade_dist(venv: Path) -> Path:
    """Write ``golden_pkg 1.0`` into the venv (files and modes fixed) and return its site-packages."""
    site = site_packages(venv)
    pkg, info, bin_ = site / "golden_pkg", site / "golden_pkg-1.0.dist-info", venv / "bin"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__pycache__").mkdir()
    info.mkdir()
    files = {
        pkg / "__init__.py": b"x = 1\n",
        pkg / "edited.py": b"edited afterwards\n",
        pkg / "md5.txt": b"hashed with md5\n",
        pkg / "nohash.txt": b"no hash in RECORD\n",
        pkg / "__pycache__" / "__init__.cpython-3.pyc": b"\x00bytecode",
        bin_ / "golden": b"#!/some/where/python\nprint('golden')\n",
        bin_ / "golden-launch": b"#!/some/where/python\n# -*- coding: utf-8 -*-\nimport sys\nfrom golden_pkg import main\n",
    }
    for p, data in files.items():
        p.write_bytes(data)
        os.chmod(p, 0o755 if p.parent == bin_ else 0o644)
    os.symlink("__init__.py", pkg / "link.py")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: golden_pkg\nVersion: 1.0\nSummary: golden\n")
    (info / "WHEEL").write_text("Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "REQUESTED").write_text("")
    (info / "entry_points.txt").write_text("[console_scripts]\ngolden-launch = golden_pkg:main\n")
    up = os.path.relpath(bin_, site)
    rows = [
        _row("golden_pkg/__init__.py", b"x = 1\n"),
        _row("golden_pkg/edited.py", b"as installed\n"),
        _row("golden_pkg/gone.py", b"gone\n"),
        _row("golden_pkg/md5.txt", b"hashed with md5\n", "md5"),
        _row("golden_pkg/nohash.txt", None),
        _row("golden_pkg/__pycache__/__init__.cpython-3.pyc", None),
        _row("golden_pkg/link.py", None),
        "golden_pkg/sub,,",
        _row(f"{up}/golden", files[bin_ / "golden"]),
        _row(f"{up}/golden-launch", files[bin_ / "golden-launch"]),
        _row("../../../../outside.txt", b"out\n"),
        _row("golden_pkg-1.0.dist-info/METADATA", (info / "METADATA").read_bytes()),
        _row("golden_pkg-1.0.dist-info/WHEEL", (info / "WHEEL").read_bytes()),
        _row("golden_pkg-1.0.dist-info/INSTALLER", b"pip\n"),
        _row("golden_pkg-1.0.dist-info/REQUESTED", b""),
        _row("golden_pkg-1.0.dist-info/entry_points.txt", (info / "entry_points.txt").read_bytes()),
        "golden_pkg-1.0.dist-info/RECORD,,",
    ]
    (info / "RECORD").write_text("\n".join(rows) + "\n")
    return site


class _Writer:
    """Collects what a scan queues (a pack writer's two verbs)."""

    def __init__(self) -> None:
        self.objects: dict[str, tuple[bytes, str]] = {}

    def queued(self, oid: str) -> bool:
        return oid in self.objects

    def add(self, oid: str, data: bytes, kind: str = "b") -> None:
        self.objects[oid] = (data, kind)


def scanned_manifests(vault: Vault, venv: Path) -> dict[str, str]:
    """``{mode: manifest text}`` of golden_pkg (its site-packages path written ``{site}``)."""
    site_rel = site_packages(venv).relative_to(venv).as_posix()
    out = {}
    for mode in ("full", "check", "lock"):
        writer = _Writer()
        _interp, packages, _warnings, cache, _ing, _stats = scan_environment(vault, venv, mode=mode, writer=writer)
        (summary,) = [p for p in packages if p["name"] in ("golden_pkg", "golden-pkg")]
        data, kind = writer.objects[summary["manifest"]]
        assert kind == "m" and object_id(data) == summary["manifest"]
        out[mode] = data.decode().replace(site_rel, "{site}")
    return out


def test_manifest_bytes_unchanged(tmp_path: Path, make_venv) -> None:
    venv = make_venv()
    handmade_dist(venv)
    vault = Vault.open(tmp_path / "vault", create=True)
    got = scanned_manifests(vault, venv)
    if os.environ.get("ENVVAULT_WRITE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(GOLDEN.read_text())
    for mode in ("full", "check", "lock"):
        assert got[mode] == want[mode], mode
    # The cases the hand-made distribution exists for all appear.
    full = json.loads(got["full"])
    states = {f["record"].rsplit("/", 1)[-1]: f for f in full["files"]}
    assert states["edited.py"]["state"] == "modified" and states["gone.py"]["state"] == "missing"
    assert "record_md5" in states["md5.txt"] and states["link.py"]["link"] == "__init__.py"
    assert states["golden-launch"].get("generated") is True and "outside.txt" not in states
    assert "sub" not in states and full["scripts"] is not None


@pytest.fixture(autouse=True)
def _fresh_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
