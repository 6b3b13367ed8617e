"""Identity on environments real installers made: pip vs uv, pip's own launchers, virtualenv, egg-links."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

from evtools import ev, ev_json
from fixtures.venvs import pip, pip_install, site_packages, uv_install
from fixtures.wheels import build_wheel


def _pkg(snap: dict, vault: Path, name: str) -> dict:
    doc = json.loads((vault / "snapshots" / f"{snap['id']}.json").read_text())
    return next(p for p in doc["packages"] if p["name"] == name)


def test_rewritten_shebang_one_build_pip_and_uv(tmp_path, make_venv):
    """A `#!python` data script rewritten by pip in one venv and by uv in another: one build id, one scripts
    id, no change in diff, and `restore --into` verifies. An edited script is an edit, not another build."""
    wheel = build_wheel(
        tmp_path / "w", "shebangdemo", "1.0", {"shebangdemo/__init__.py": b"def main():\n    print('hi')\n"},
        scripts={"shebang-tool": b"#!python\nimport shebangdemo\nshebangdemo.main()\n"},
        console_scripts={"shebang-cli": "shebangdemo:main"},
    )
    by_pip, by_uv = make_venv("venv", name="by-pip"), make_venv("uv", name="by-uv")
    pip_install(by_pip, wheel)
    uv_install(by_uv, wheel)
    assert (by_pip / "bin" / "shebang-tool").read_bytes() != (by_uv / "bin" / "shebang-tool").read_bytes()
    vault = tmp_path / "vault"
    a = ev_json(vault, "snap", "--venv", by_pip)
    b = ev_json(vault, "snap", "--venv", by_uv)
    pa, pb = _pkg(a, vault, "shebangdemo"), _pkg(b, vault, "shebangdemo")
    assert pa["build_id"] == pb["build_id"] and pa["state_id"] == pb["state_id"]
    assert pa["scripts"] is not None and pa["scripts"] == pb["scripts"]
    diff = ev_json(vault, "diff", a["id"], b["id"])
    assert [c["name"] for c in diff["packages"]["changed"]] == [], diff["packages"]
    into = ev(vault, "restore", a["id"], "--into", tmp_path / "into")
    assert "verified" in into.stdout and "NOT verified" not in into.stdout, into.stdout

    script = by_uv / "bin" / "shebang-tool"
    script.write_bytes(script.read_bytes() + b"# edited\n")
    status = ev_json(vault, "status", "--venv", by_uv)
    [change] = status["packages"]["changed"]
    assert (change["name"], change["kind"]) == ("shebangdemo", "edited"), change


def test_pip_launchers_are_generated_not_data_scripts(tmp_path, make_venv):
    """pip writes bin/pip3.X for the running Python, which recent pips' entry_points.txt does not name:
    export and --into must not carry it as a `pip-*.data/scripts/` file."""
    venv = make_venv("venv", name="pipvenv")
    pip(venv, "install", "-q", "--no-cache-dir", "pip")
    minor = "%d.%d" % sys.version_info[:2]
    info = next(site_packages(venv).glob("pip-*.dist-info"))
    assert (venv / "bin" / f"pip{minor}").exists()
    assert f"pip{minor} " not in (info / "entry_points.txt").read_text().replace("=", " ")
    vault = tmp_path / "vault"
    snap = ev_json(vault, "snap", "--venv", venv)
    lock = tmp_path / "exp" / "pylock.toml"
    ev(vault, "export", snap["id"], "-o", lock)
    [wheel] = (tmp_path / "exp").glob("*.wheels/pip-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        assert [n for n in zf.namelist() if ".data/" in n] == []
    assert _pkg(snap, vault, "pip")["scripts"] is None  # launchers only
    into = ev(vault, "restore", snap["id"], "--into", tmp_path / "into")
    assert "verified" in into.stdout and "NOT verified" not in into.stdout, into.stdout


def test_virtualenv_venv_snaps(tmp_path):
    """virtualenv's seeder lists folders (`pip/__pycache__,,`) and unhashed files in RECORD: snap works and
    says so; a folder row, a row without hash and a row for a file that is gone each warn, none is fatal."""
    venv = tmp_path / "ve"
    subprocess.run([sys.executable, "-m", "virtualenv", "-q", str(venv)], check=True)
    info = next(site_packages(venv).glob("pip-*.dist-info"))
    record = (info / "RECORD").read_text()
    assert "pip/__pycache__,," in record or "/__pycache__,," in record
    (info / "RECORD").write_text(record + "pip/_vendor,,\npip/extra.txt,,\n")
    (site_packages(venv) / "pip" / "extra.txt").write_text("not hashed\n")
    (site_packages(venv) / "pip" / "py.typed").unlink()
    vault = tmp_path / "vault"
    snap = ev_json(vault, "snap", "--venv", venv)
    warnings = "\n".join(snap["warnings"])
    assert "RECORD names folders, not files (left out): pip/_vendor" in warnings
    assert "RECORD gives no hash (stored as found): pip/extra.txt\n" in warnings + "\n"
    assert "RECORD lists files that are gone (recorded as missing): pip/py.typed" in warnings
    assert {p["name"] for p in json.loads((vault / "snapshots" / f"{snap['id']}.json").read_text())["packages"]} \
        >= {"pip", "setuptools"}
    ev(vault, "status", "--venv", venv, "--exit-code")
    again = ev_json(vault, "snap", "--venv", venv)
    assert again["fingerprint"] == snap["fingerprint"]


def test_egg_link_editable_listed_and_seen_going(tmp_path, make_venv):
    """`pip install --no-use-pep517 -e` leaves an .egg-link and an easy-install.pth line: the package is
    listed (with a warning that its files live outside the venv), and status sees it uninstalled."""
    venv = make_venv("venv", with_pip=True, name="eggvenv")
    proj = tmp_path / "proj"
    (proj / "eggdemo").mkdir(parents=True)
    (proj / "setup.py").write_text('from setuptools import setup\nsetup(name="eggdemo", version="0.1", packages=["eggdemo"])\n')
    (proj / "eggdemo" / "__init__.py").write_text("X = 1\n")
    pip(venv, "install", "-q", "setuptools<80", "wheel")
    pip(venv, "install", "-q", "--no-build-isolation", "--no-use-pep517", "-e", str(proj))
    site = site_packages(venv)
    assert (site / "eggdemo.egg-link").exists() and str(proj) in (site / "easy-install.pth").read_text()
    vault = tmp_path / "vault"
    snap = ev_json(vault, "snap", "--venv", venv)
    egg = _pkg(snap, vault, "eggdemo")
    assert (egg["version"], egg["record"]) == ("0.1", "missing")
    assert any("eggdemo 0.1 is an old-style editable" in w and str(proj) in w for w in snap["warnings"])
    ev(vault, "status", "--venv", venv, "--exit-code")
    pip(venv, "uninstall", "-y", "-q", "eggdemo")
    status = ev_json(vault, "status", "--venv", venv)
    assert [p["name"] for p in status["packages"]["removed"]] == ["eggdemo"]
