"""``restore --into`` and ``export`` keep where packages came from (issue 9, items 8 and 9).

One real environment, built with the real tools: ``python -m venv --system-site-packages`` (pip and
setuptools come from the base interpreter's site), a fixture wheel pulled in as a dependency (no
``REQUESTED``), a PEP 660 editable (``pip install -e`` of a setuptools project), a ``file://`` wheel and a
local folder install. ``restore --into`` must reproduce every provenance file and the pyvenv setting;
``export`` must name each source the PEP 751 way, validated by ``packaging.pylock``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from fixtures.venvs import site_packages
from fixtures.wheels import build_wheel
from tests.evtools import ev, ev_json

BASE_PYTHON = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
PROVENANCE = ("INSTALLER", "REQUESTED", "direct_url.json")
_SETUP_PY = "from setuptools import setup\nsetup()\n"
_PYPROJECT = '[build-system]\nrequires = ["setuptools>=70"]\nbuild-backend = "setuptools.build_meta"\n'


def _project(root: Path, name: str, requires: list[str]) -> Path:
    """A tiny setuptools project (setup.cfg, one module) in ``root/name``."""
    proj = root / name
    (proj / name).mkdir(parents=True)
    (proj / name / "__init__.py").write_text(f"NAME = {name!r}\n")
    deps = "".join(f"\n    {r}" for r in requires)
    (proj / "setup.cfg").write_text(
        f"[metadata]\nname = {name}\nversion = 1.0\n\n[options]\npackages = {name}\ninstall_requires ={deps}\n"
    )
    (proj / "setup.py").write_text(_SETUP_PY)
    (proj / "pyproject.toml").write_text(_PYPROJECT)
    return proj


def _pip(venv: Path, *args, backend: Path) -> None:
    """The venv's pip (the base interpreter's, seen through the system site), offline, building with the
    setuptools unpacked in ``backend`` (on PYTHONPATH only: it is not installed into the venv)."""
    env = {**os.environ, "PYTHONPATH": str(backend)}
    env.pop("VIRTUAL_ENV", None)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-index",
                    "--no-build-isolation", *map(str, args)], check=True, capture_output=True, text=True, env=env)


@pytest.fixture(scope="module")
def shaped(tmp_path_factory) -> dict:
    """The environment, its snapshot and vault (module scope: building it takes a few seconds)."""
    tmp = tmp_path_factory.mktemp("shapes")
    wheels = tmp / "wheels"
    build_wheel(wheels, "depleaf", "1.0", {"depleaf/__init__.py": b"LEAF = 1\n"})
    filewheel = build_wheel(tmp / "direct", "filewheel", "2.0", {"filewheel/__init__.py": b"FW = 2\n"})
    # The build backend, from the configured registry (the base site's setuptools 65 needs the ``wheel``
    # package for bdist_wheel; setuptools >= 70 does not), unpacked beside the venv.
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
                    "-d", str(tmp / "backend"), "setuptools>=70"], check=True, capture_output=True, text=True)
    backend = tmp / "backend" / "site"
    for whl in (tmp / "backend").glob("setuptools-*.whl"):
        zipfile.ZipFile(whl).extractall(backend)
    editable = _project(tmp / "src", "edproj", ["depleaf"])
    folder = _project(tmp / "src", "folderproj", [])
    venv = tmp / "venv"
    subprocess.run([str(BASE_PYTHON), "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                   check=True)
    _pip(venv, "--find-links", wheels, "-e", editable, backend=backend)
    _pip(venv, filewheel.as_uri(), folder, backend=backend)
    vault = tmp / "vault"
    snap = ev_json(vault, "snap", "--venv", venv, "--no-caches")
    return {"tmp": tmp, "venv": venv, "vault": vault, "sid": snap["id"], "editable": editable,
            "folder": folder, "filewheel": filewheel}


def _dist_info(venv: Path, name: str) -> Path:
    found = list(site_packages(venv).glob(f"{name}-*.dist-info"))
    assert len(found) == 1, (name, found)
    return found[0]


def _provenance(venv: Path, name: str) -> dict:
    di = _dist_info(venv, name)
    return {f: (di / f).read_bytes() if (di / f).exists() else None for f in PROVENANCE}


def _cfg(venv: Path) -> dict:
    out = {}
    for line in (venv / "pyvenv.cfg").read_text().splitlines():
        k, _, v = line.partition("=")
        out[k.strip()] = v.strip()
    return out


NAMES = ("depleaf", "edproj", "filewheel", "folderproj")


def test_shapes_have_the_provenance_the_tests_rely_on(shaped):
    venv = shaped["venv"]
    assert _provenance(venv, "depleaf")["REQUESTED"] is None  # a dependency: not requested
    assert json.loads(_provenance(venv, "edproj")["direct_url.json"])["dir_info"] == {"editable": True}
    assert json.loads(_provenance(venv, "folderproj")["direct_url.json"])["dir_info"] == {}
    assert "archive_info" in json.loads(_provenance(venv, "filewheel")["direct_url.json"])
    assert _cfg(venv)["include-system-site-packages"] == "true"


@pytest.fixture(scope="module")
def restored(shaped) -> Path:
    new = shaped["tmp"] / "into"
    out = ev_json(shaped["vault"], "restore", shaped["sid"], "--into", new)
    assert out["verified"] is True, out
    assert out["warnings"] == [], out
    return new


def test_into_reproduces_provenance_files(shaped, restored):
    for name in NAMES:
        assert _provenance(restored, name) == _provenance(shaped["venv"], name), name


def test_into_record_rows_of_provenance_match(shaped, restored):
    for name in NAMES:
        def rows(venv):
            di = _dist_info(venv, name)
            return sorted(ln for ln in (di / "RECORD").read_text().splitlines()
                          if ln.split(",")[0].rsplit("/", 1)[-1] in PROVENANCE)
        assert rows(restored) == rows(shaped["venv"]), name


def test_into_keeps_system_site_packages_and_editable(shaped, restored):
    assert _cfg(restored)["include-system-site-packages"] == "true"
    py = str(restored / "bin" / "python")
    # pip lives only in the base interpreter's site: importable through the system site
    subprocess.run([py, "-c", "import pip, edproj, depleaf, filewheel, folderproj"], check=True)
    listed = subprocess.run([py, "-m", "pip", "list", "--editable", "--format", "json"], check=True,
                            capture_output=True, text=True).stdout
    assert [p["name"] for p in json.loads(listed)] == ["edproj"]


def test_into_verification_compares_provenance_and_pyvenv(shaped, restored):
    from envvault.restore import into, pyvenv

    from envvault.vault.store import Vault

    vault = Vault.open(shaped["vault"])
    snap = vault.load_snapshot(shaped["sid"]).snapshot
    provenance = into._provenance_of(vault, snap.packages)
    wanted = pyvenv.pyvenv_wanted(snap.python)
    assert into._provenance_differences(restored, snap.python, provenance) == []
    assert pyvenv.settings_differences(restored, wanted) == []
    requested = _dist_info(restored, "depleaf") / "REQUESTED"
    requested.write_bytes(b"")
    cfg = (restored / "pyvenv.cfg").read_text()
    (restored / "pyvenv.cfg").write_text(cfg.replace("include-system-site-packages = true",
                                                     "include-system-site-packages = false"))
    try:
        assert [d for d in into._provenance_differences(restored, snap.python, provenance)] == [
            f"{_dist_info(restored, 'depleaf').name}/REQUESTED differs from the snapshot's"]
        assert pyvenv.settings_differences(restored, wanted) == [
            "pyvenv.cfg include-system-site-packages is 'false', the snapshot had 'true'"]
    finally:
        requested.unlink()
        (restored / "pyvenv.cfg").write_text(cfg)


# -- export ------------------------------------------------------------------------------------------------


def _export(shaped, name: str, *args) -> dict:
    out = shaped["tmp"] / "export" / name
    ev(shaped["vault"], "export", shaped["sid"], "-o", out, *args)
    return tomllib.loads(out.read_text()) if out.suffix == ".toml" else {"text": out.read_text()}


def _validated(lock: dict) -> dict:
    """The lock as PEP 751 says it must be (packaging >= 26's reference parser), by package name."""
    from packaging.pylock import Pylock

    Pylock.from_dict(lock).validate()
    return {p["name"]: p for p in lock["packages"]}


def test_export_pylock_names_directory_editable_and_archive(shaped):
    full = _validated(_export(shaped, "full/pylock.toml"))
    lock = _export(shaped, "bare/pylock.toml", "--no-wheels")
    # depleaf came from an index: with --no-wheels it has no source (export warns; see below), which PEP 751
    # does not allow; every other entry must be valid as written
    bare = _validated({**lock, "packages": [p for p in lock["packages"] if p["name"] != "depleaf"]})
    assert [p for p in lock["packages"] if p["name"] == "depleaf"][0].keys() == {"name", "version", "tool"}
    editable = {"path": str(shaped["editable"]), "editable": True}
    assert full["edproj"]["directory"] == editable and "wheels" not in full["edproj"]
    assert bare["edproj"]["directory"] == editable
    assert bare["folderproj"]["directory"] == {"path": str(shaped["folder"])}
    sha = __import__("hashlib").sha256(shaped["filewheel"].read_bytes()).hexdigest()
    assert bare["filewheel"]["archive"] == {"path": str(shaped["filewheel"]), "hashes": {"sha256": sha}}
    for name in ("depleaf", "filewheel", "folderproj"):  # with wheels: the stored bytes, the origin kept aside
        assert [w["name"].split("-")[0] for w in full[name]["wheels"]] == [name]
    assert full["folderproj"]["tool"]["envvault"]["origin"] == {"directory": {"path": str(shaped["folder"])}}


def test_export_requires_python_is_the_minor_version(shaped):
    from packaging.specifiers import SpecifierSet

    lock = _export(shaped, "py/pylock.toml", "--no-wheels")
    spec = SpecifierSet(lock["requires-python"])
    minor = ".".join(map(str, sys.version_info[:2]))
    assert spec.contains(f"{minor}.0") and spec.contains(f"{minor}.99")
    assert not spec.contains(f"{sys.version_info[0]}.{sys.version_info[1] + 1}.0")


def test_export_requirements_keeps_direct_references(shaped):
    text = _export(shaped, "requirements.txt", "--format", "requirements")["text"]
    lines = {ln.split("  #")[0] for ln in text.splitlines() if not ln.startswith("#")}
    assert lines == {
        "depleaf==1.0",
        f"-e {shaped['editable'].as_uri()}",
        f"filewheel @ {shaped['filewheel'].as_uri()}",
        f"folderproj @ {shaped['folder'].as_uri()}",
    }


def test_export_warns_when_an_installed_folder_is_gone(shaped, tmp_path):
    moved = tmp_path / "away"
    shaped["folder"].rename(moved)
    try:
        proc = ev(shaped["vault"], "export", shaped["sid"], "-o", tmp_path / "pylock.toml", "--no-wheels")
    finally:
        moved.rename(shaped["folder"])
    assert f"folderproj 1.0: the lock installs it from {shaped['folder']}, which no longer exists" in proc.stderr


def test_export_no_wheels_warns_about_packages_without_source(shaped, tmp_path):
    proc = ev(shaped["vault"], "export", shaped["sid"], "-o", tmp_path / "pylock.toml", "--no-wheels")
    assert "1 package installed from an index has no source in the lock (--no-wheels): depleaf 1.0" in proc.stderr
    assert "edproj" not in proc.stderr and "folderproj" not in proc.stderr and "filewheel" not in proc.stderr


def test_export_again_to_the_same_lock_warns_of_wheels_it_does_not_name(shaped, tmp_path):
    """An earlier export's wheels stay in `<stem>.wheels/` (nothing a person may have put there is deleted),
    and a warning names them; the lock names only its own."""
    out = tmp_path / "pylock.toml"
    first = ev_json(shaped["vault"], "export", shaped["sid"], "-o", out)
    assert first["warnings"] == [] and first["wheels"] == 3, first
    stale = Path(first["wheel_dir"]) / "oldpkg-0.9-py3-none-any.whl"
    stale.write_bytes(b"an earlier export's")
    again = ev_json(shaped["vault"], "export", shaped["sid"], "-o", out)
    (warning,) = again["warnings"]
    assert "also holds 1 wheel(s) pylock.toml does not name (oldpkg-0.9-py3-none-any.whl)" in warning, warning
    assert stale.read_bytes() == b"an earlier export's"
    assert "oldpkg" not in out.read_text()
