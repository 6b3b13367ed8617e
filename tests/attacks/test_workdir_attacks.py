"""Hostile working directories (issue 14, items 9 and 10): the shell hook run inside a checkout that holds
an ``envvault/`` folder (and modules shadowing the standard library), the background snap of checkpoint
stamping started from such a folder, the ``.pth`` stamping hook, and checkpoint stamping inside a git
repository whose config names commands (``core.fsmonitor``). Each asserts that a marker file the hostile
code would create never appears, and that envvault still did its work.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from envvault.guard.hook import hook_code
from tests.evtools import ROOT, ev_env

PAYLOAD = "import pathlib; pathlib.Path({marker!r}).write_text('ran from the working directory')\n"


def _hostile_checkout(where: Path, marker: Path) -> Path:
    """A folder holding an ``envvault`` package and modules named like the standard library's that
    envvault imports after start-up (typing, gettext, json): each writes ``marker`` when imported."""
    where.mkdir(parents=True)
    pkg = where / "envvault"
    pkg.mkdir()
    code = PAYLOAD.format(marker=str(marker))
    for path in (pkg / "__init__.py", pkg / "__main__.py", where / "typing.py", where / "gettext.py",
                 where / "json.py"):
        path.write_text(code)
    return where


def _fake_tool(bindir: Path, name: str, log: Path) -> None:
    """``name`` on PATH: records how it was called (and whether guard ran it) instead of doing anything."""
    bindir.mkdir(exist_ok=True)
    tool = bindir / name
    tool.write_text(f'#!/bin/sh\necho "{name} guard=${{ENVVAULT_GUARD_ACTIVE:-no}} $*" >> {log}\n')
    tool.chmod(0o755)


def test_shell_hook_ignores_code_in_the_working_directory(tmp_path):
    marker = tmp_path / "marker"
    checkout = _hostile_checkout(tmp_path / "checkout", marker)
    log = tmp_path / "calls.log"
    bindir = tmp_path / "bin"
    minor = f"python3.{sys.version_info[1]}"
    for name in ("pip", "python", minor):
        _fake_tool(bindir, name, log)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    script = (f'eval "$(cat {tmp_path / "hook.sh"})"\n'
              "pip install --dry-run requests\n"
              "python -mpip install --dry-run requests\n"
              f"{minor} -m pip install --dry-run requests\n")
    (tmp_path / "hook.sh").write_text(hook_code("bash", python=sys.executable))
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path), "VIRTUAL_ENV": str(venv),
           "PYTHONPATH": str(ROOT), "ENVVAULT_HOME": str(tmp_path / "vault")}
    proc = subprocess.run(["bash", "--norc", "--noprofile", "-c", script], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=300)
    assert not marker.exists(), marker.read_text() + proc.stderr
    # envvault ran (the real one) and passed each dry run through to the tool, the -mpip and python3.N
    # spellings included.
    assert log.read_text().splitlines() == [
        "pip guard=1 install --dry-run requests",
        "python guard=1 -mpip install --dry-run requests",
        f"{minor} guard=1 -m pip install --dry-run requests",
    ], proc.stderr


def test_background_snap_of_stamping_ignores_code_in_the_working_directory(tmp_path, monkeypatch):
    from envvault.torch import naming
    from envvault.torch.hook import runtime_path
    from envvault.vault.store import Vault

    marker = tmp_path / "marker"
    checkout = _hostile_checkout(tmp_path / "checkout", marker)
    vault = Vault.open(tmp_path / "vault", create=True)
    started: list[list[str]] = []
    monkeypatch.setattr(naming, "subprocess", SimpleNamespace(run=lambda cmd, **kw: started.append(cmd)))
    naming.spawn_full_snapshot(vault, Path(sys.prefix), "f" * 64, runtime_path())
    cmd = started[0][started[0].index(sys.executable):]  # the command sh starts in the background
    # Run it where a training process could stand, asking only for the version.
    proc = subprocess.run([cmd[0], "-c", cmd[2], "--version"], cwd=checkout, capture_output=True, text=True,
                          timeout=120, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert not marker.exists(), proc.stderr
    assert proc.returncode == 0 and "envvault" in proc.stdout, proc.stderr


def test_pth_stamping_hook_ignores_code_in_the_working_directory(tmp_path, make_venv, monkeypatch):
    from envvault.torch.hook import install_hook

    venv = make_venv("uv", name="train")
    marker = tmp_path / "marker"
    checkout = _hostile_checkout(tmp_path / "checkout", marker)
    monkeypatch.chdir(checkout)  # install-hook run from there checks the venv's python from there too
    install_hook(venv)
    assert not marker.exists()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["ENVVAULT_STAMP"] = "1"
    python = str(venv / "bin" / "python")
    armed = subprocess.run([python, "-c", "import sys, envvault; print('envvault.torch._autostamp' in sys.modules, "
                            "envvault.__file__)"], cwd=checkout, env=env, capture_output=True, text=True, timeout=120)
    assert not marker.exists(), armed.stderr
    assert armed.stdout.split()[0] == "True", armed.stdout + armed.stderr  # the hook ran ...
    assert not armed.stdout.split()[1].startswith(str(checkout)), armed.stdout  # ... with the real envvault


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                   env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(repo.parent)})


@pytest.fixture
def repo(tmp_path):
    """A git work tree with one commit on branch ``main`` and a tracked file."""
    repo = tmp_path / "unpacked"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "train.py").write_text("print('train')\n")
    _git(repo, "add", "train.py")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    return repo


def _stamp_git(cwd: Path) -> dict:
    """The ``git`` field of a stamp made by a process standing in ``cwd``."""
    code = ("import json, sys; from pathlib import Path; from envvault.torch.stamp_doc import base_stamp\n"
            "doc = base_stamp(state=None, snapshot=None, vault_root=None, prefix=Path(sys.prefix), warnings=[])\n"
            "print(json.dumps(doc.to_dict()['git']))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(cwd.parent)})
    assert proc.returncode == 0, proc.stderr
    import json

    return json.loads(proc.stdout)


def test_stamping_in_a_repository_runs_none_of_its_configured_commands(repo, tmp_path):
    marker = tmp_path / "marker"
    hook = tmp_path / "fsmonitor.sh"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\n")
    hook.chmod(0o755)
    _git(repo, "config", "core.fsmonitor", str(hook))
    (repo / "train.py").write_text("print('edited')\n")  # a change: git status would consult fsmonitor
    head = (repo / ".git" / "refs" / "heads" / "main").read_text().strip()
    sub = repo / "runs" / "exp1"
    sub.mkdir(parents=True)
    git = _stamp_git(sub)
    assert not marker.exists()
    assert git == {"root": str(repo), "commit": head, "branch": "main", "dirty": None}


def test_stamping_in_a_plain_repository_still_says_whether_it_is_dirty(repo):
    git = _stamp_git(repo)
    assert git["branch"] == "main" and len(git["commit"]) == 40 and git["dirty"] is False
    (repo / "train.py").write_text("print('edited')\n")
    assert _stamp_git(repo)["dirty"] is True
    _git(repo, "pack-refs", "--all")  # the branch now lives in packed-refs only
    assert not (repo / ".git" / "refs" / "heads" / "main").exists()
    assert _stamp_git(repo)["commit"] == git["commit"]


def test_stamping_reads_no_fifo_in_the_repository(repo):
    head = repo / ".git" / "HEAD"
    head.unlink()
    os.mkfifo(head)  # reading it would block the training process forever
    git = _stamp_git(repo)
    assert git == {"root": str(repo), "commit": None, "branch": None, "dirty": None}


def test_cache_snap_ask_torch_ignores_code_in_the_working_directory(tmp_path):
    """`cache snap --ask-torch` runs the venv's Python in the user's folder: an `importlib/` there must not run."""
    marker = tmp_path / "PWNED"
    cwd = tmp_path / "checkout"
    (cwd / "importlib").mkdir(parents=True)
    (cwd / "importlib" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["ENVVAULT_HOME"] = str(tmp_path / "vault")
    envvault = Path(sys.executable).parent / "envvault"
    proc = subprocess.run([str(envvault), "cache", "snap", "--venv", str(venv), "--ask-torch"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 7 and "Traceback" not in proc.stderr, proc  # no torch in that venv: it says so
    assert not marker.exists(), "code from the working directory ran"


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_fifo_or_dev_zero_in_a_dist_info_does_not_hang_a_snap(tmp_path, make_venv, kind):
    """A site folder may be writable by others: a FIFO as METADATA, or RECORD linked to /dev/zero, is one
    line and a non-zero exit, at once and in bounded memory (it had hung, or grown until killed)."""
    venv = make_venv("uv")
    site = next((venv / "lib").glob("python3*/site-packages"))
    d = site / "hostile-1.0.dist-info"
    d.mkdir()
    if kind == "fifo":
        os.mkfifo(d / "METADATA")
        (d / "RECORD").write_text("")
    else:
        (d / "METADATA").write_text("Metadata-Version: 2.1\nName: hostile\nVersion: 1.0\n")
        os.symlink("/dev/zero", d / "RECORD")
    proc = subprocess.run([sys.executable, "-m", "envvault", "--vault", str(tmp_path / "vault"), "snap", "--venv",
                           str(venv), "--no-caches"], capture_output=True, text=True, timeout=60, env=ev_env(tmp_path / "vault"))
    assert proc.returncode not in (0, 70), proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a regular file" in lines[0], proc.stderr


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_environment_files_read_outside_a_scan_wait_on_no_fifo(tmp_path, kind):
    """The files of an environment read outside a scan (the compile cache fingerprint's RECORD and module
    constants, guard's installed RECORD rows and ``direct_url.json``, the restore's hash of a RECORD it may
    replace, a venv's ``pyvenv.cfg`` and ``.envvault.toml``): a FIFO there, or a link to /dev/zero, is skipped or one clear error, at once (each had been read
    with ``read_text``/``open``: a FIFO waited for a writer forever, /dev/zero grew until the limit or memory)."""
    site = tmp_path / "site"
    d = site / "torch-2.0.dist-info"
    d.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(d / "RECORD")
    else:
        os.symlink("/dev/zero", d / "RECORD")
    code = ("import sys; from pathlib import Path; from envvault.env.static import find_dist_info, record_digest\n"
            "from envvault.errors import EnvironmentProblem\n"
            f"site = Path({str(site)!r})\n"
            "print('found', find_dist_info(site, 'torch'))\n"
            "try:\n    record_digest(site / 'torch-2.0.dist-info')\nexcept EnvironmentProblem as err:\n"
            "    print('refused', err)\n"
            "from envvault.env.static import module_constants\n"
            "try:\n    module_constants(site / 'torch-2.0.dist-info' / 'RECORD', {'x'})\n"
            "except EnvironmentProblem as err:\n    print('refused', err)\n"
            "from envvault.guard.builds import installed_rows, _direct_url_sha256\n"
            "print('rows', installed_rows(site / 'torch-2.0.dist-info'))\n"
            "import os; os.replace(site / 'torch-2.0.dist-info' / 'RECORD', site / 'torch-2.0.dist-info' / 'direct_url.json')\n"
            "print('direct url', _direct_url_sha256(site / 'torch-2.0.dist-info'))\n"
            "from envvault.restore.current import _sha_of_small\n"
            "print('sha', _sha_of_small(str(site / 'torch-2.0.dist-info' / 'direct_url.json')))\n"
            "from envvault.env.probe import read_pyvenv_cfg\n"
            "from envvault.caches.config import venv_doc\n"
            "from envvault.errors import UsageError\n"
            "prev = site / 'torch-2.0.dist-info' / 'direct_url.json'\n"
            "for name in ('pyvenv.cfg', '.envvault.toml'):\n"
            "    os.replace(prev, site / name)\n"
            "    prev = site / name\n"
            "    try:\n        print(name, read_pyvenv_cfg(site) if name == 'pyvenv.cfg' else venv_doc(site))\n"
            "    except UsageError as err:\n        print(name, 'refused', err)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc
    out = proc.stdout.splitlines()
    assert out[0] == "found None" and out[1].startswith("refused cannot read") and "RECORD" in out[1], proc.stdout
    assert out[2].startswith("refused cannot parse") and "not a regular file" in out[2], proc.stdout
    assert out[3:6] == ["rows None", "direct url None", "sha None"], proc.stdout
    assert out[6] == "pyvenv.cfg {}" and out[7].startswith(".envvault.toml refused") and "cannot be read" in out[7]


def test_compile_cache_fingerprints_wait_on_no_fifo(tmp_path):
    """What a cache fingerprint reads besides RECORD: torch's modules for its source key (a FIFO as a module
    is one ``EnvironmentProblem``, as it had been a ``FileNotFoundError``) and a cache tree's Triton and Inductor entries (a FIFO there is skipped),
    at once; both had been read with ``open``/``read_text``, which wait for a writer."""
    torch_dir = tmp_path / "site" / "torch"
    torch_dir.mkdir(parents=True)
    (torch_dir / "__init__.py").write_text("__version__ = '2.0'\n")
    os.mkfifo(torch_dir / "evil.py")
    other = tmp_path / "site2" / "torch"  # a FIFO as one of the non-module files torch's key reads
    (other / "_inductor").mkdir(parents=True)
    (other / "__init__.py").write_text("__version__ = '2.0'\n")
    os.mkfifo(other / "_inductor" / "script.ld")
    tree = tmp_path / "cache"
    (tree / "triton" / "0" / "k").mkdir(parents=True)
    os.mkfifo(tree / "triton" / "0" / "k" / "k.json")
    (tree / "fxgraph" / "a" / "b").mkdir(parents=True)
    os.mkfifo(tree / "fxgraph" / "a" / "b" / "entry")
    code = ("from pathlib import Path\n"
            "from envvault.caches._torchkey import torch_source_key\n"
            "from envvault.caches._tree import infer\n"
            "from envvault.errors import EnvironmentProblem\n"
            "try:\n"
            f"    torch_source_key(Path({str(torch_dir)!r}), '2.0', ['.so'])\n"
            "except EnvironmentProblem as err:\n    print('refused', err)\n"
            "try:\n"
            f"    torch_source_key(Path({str(other)!r}), '2.0', ['.so'])\n"
            "except EnvironmentProblem as err:\n    print('refused', err)\n"
            f"fp = infer(Path({str(tree)!r}))\n"
            "print('tree', fp.torch_version, fp.triton_version)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc
    out = proc.stdout.splitlines()
    assert out[0].startswith("refused cannot read") and "evil" in out[0] and "no module file" in out[0], out
    assert out[1].startswith("refused cannot read") and "script.ld" in out[1] and "not a regular file" in out[1], out
    assert out[2] == "tree None None", out


def test_a_fifo_given_as_a_lockfile_is_refused_at_once(tmp_path):
    """``diff A pylock.toml`` with a FIFO (or /dev/zero) in the lockfile's place: one line, a non-zero exit, at
    once; and the lockfile reader itself refuses one (it read with ``read_text``: a FIFO swapped in after the
    command's check would have been waited on)."""
    from envvault.errors import CorruptError
    from envvault.lock.pylock_doc import lockfile_document
    from envvault.vault.store import Vault

    Vault.open(tmp_path / "vault", create=True)
    fifo = tmp_path / "pylock.toml"
    os.mkfifo(fifo)
    zero = tmp_path / "zero" / "pylock.toml"
    zero.parent.mkdir()
    os.symlink("/dev/zero", zero)
    for lock in (fifo, zero):
        proc = subprocess.run([sys.executable, "-m", "envvault", "diff", str(lock), str(lock)], capture_output=True,
                              text=True, timeout=60, env=ev_env(tmp_path / "vault"))
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode not in (0, 70) and len(lines) == 1, proc
        with pytest.raises(CorruptError, match="not a regular file"):  # the reader itself, past the CLI's check
            lockfile_document(lock)


def test_a_script_swapped_for_a_fifo_after_its_read_is_not_waited_on(tmp_path):
    """A script of bin/ is read once more after hashing, for its launcher check and shebang-normalised digest
    (``ManifestBuilder._script``): a FIFO put in its place between the two reads is taken as edited (None), at
    once; it was opened with ``open``, which waits for a writer."""
    (tmp_path / "bin").mkdir()
    os.mkfifo(tmp_path / "bin" / "tool")
    code = ("from types import SimpleNamespace\n"
            "from envvault.snap.manifests import ManifestBuilder\n"
            f"me = SimpleNamespace(_base={str(tmp_path) + '/'!r})\n"
            "print(ManifestBuilder._script(me, {'state': 'ok', 'path': 'bin/tool', 'size': 10}, None, None))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "None", proc


def test_no_pth_file_of_the_environment_runs_when_envvault_asks_its_interpreter(tmp_path, make_venv):
    """A restored environment holds what a vault wrote, a .pth file included: envvault asks a venv's
    interpreter about itself with -I -S, so no .pth file runs (it ran on every probe before, during a restore's
    verify scan too). The answer still names the venv's own prefix and site-packages."""
    venv = make_venv("uv")
    site = next((venv / "lib").glob("python3*/site-packages"))
    marker = tmp_path / "ran"
    (site / "evil.pth").write_text(f"import os; open({str(marker)!r}, 'w').write(str(os.getpid()))\n")
    proc = subprocess.run([sys.executable, "-m", "envvault", "--vault", str(tmp_path / "vault"), "snap", "--venv",
                           str(venv), "--no-caches", "--json"], capture_output=True, text=True, timeout=120,
                          env=ev_env(tmp_path / "vault"))
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists(), "a .pth file of the environment ran"
    from envvault.env.probe import probe

    info = probe(venv)
    assert info.prefix == venv and info.purelib == site and not marker.exists()


def test_a_snap_never_runs_an_nvidia_smi_left_in_the_working_directory(tmp_path, make_venv):
    """A PATH with an empty entry (``/usr/bin:``, a common slip) names the working directory to
    ``shutil.which``: a snap (its host facts, the compile caches' fingerprint) run in a folder holding an
    executable ``nvidia-smi`` must not run it (``env/host.find_on_path`` skips empty entries)."""
    marker = tmp_path / "PWNED"
    cwd = tmp_path / "checkout"
    cwd.mkdir()
    fake = cwd / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\ntouch {marker}\necho 'Evil GPU, 9.0, 999.0, 1 MiB'\n")
    fake.chmod(0o755)
    venv = make_venv("venv", name="venv")
    env = ev_env(tmp_path / "vault")
    env["PATH"] = os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep)
                                  if d and not os.path.exists(os.path.join(d, "nvidia-smi"))) + os.pathsep
    for args in (["snap", "--venv", str(venv)], ["cache", "snap", "--venv", str(venv)]):
        proc = subprocess.run([sys.executable, "-m", "envvault", *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=300)
        assert "Traceback" not in proc.stderr, proc.stderr
        assert not marker.exists(), f"{args[0]} ran the working directory's nvidia-smi"
    assert subprocess.run(["sh", "-c", "nvidia-smi"], cwd=cwd, env=env, capture_output=True).returncode == 0
    assert marker.exists()  # the PATH given does reach it, as a shell would
