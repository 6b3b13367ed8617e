"""What the commands take as input, as users type it (issue 9 items 7, 11, 12, 13).

- A folder that is not a virtual environment (``/usr``, a venv without ``pyvenv.cfg``, a conda-like
  prefix whose ``bin/python`` belongs to another installation, a venv whose ``bin/python`` runs another
  prefix) is refused by every command that takes ``--venv``: one line, exit 2.
- ``current`` without ``--venv`` and without an active venv is the environment the other side names.
- A checkpoint folder (Hugging Face ``checkpoint-N/``) is taken wherever a checkpoint file is; its
  stamps must agree.
- An environment's snap archives a discovered compile cache only when the environment can use it.

Stamps are written by the real stamping code, run by each venv's own Python through the installed hook.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import zipfile
import pickle
from pathlib import Path

import pytest

from fixtures import build_wheel, uv_install
from tests.evtools import assert_one_line_error, ev, ev_env, ev_json
from fixtures.machine import base_python

BASE_PYTHON = base_python()


def _env(vault: Path, **extra: str) -> dict:
    env = ev_env(vault, **extra)
    env.pop("CONDA_PREFIX", None)
    return env


def _run(vault: Path, *args, **extra: str) -> subprocess.CompletedProcess:
    return ev(vault, *args, check=False, env=_env(vault, **extra), timeout=120)


def _stamp(venv: Path, vault: Path, *paths: Path) -> None:
    """Stamp saved checkpoints with ``venv``'s own Python, as a training script there would (the hook)."""
    code = "import sys\nfrom envvault.torch import plugin\nfor p in sys.argv[1:]:\n    plugin.stamp(p)\n"
    # No detached full snap: one committing later would change which snapshot a stamp resolves to mid-test.
    env = _env(vault, ENVVAULT_STAMP="1", ENVVAULT_STAMP_FULL_SNAPSHOT="0")
    env.pop("PYTHONPATH", None)  # envvault comes through the venv's hook, as for users
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", code, *map(str, paths)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def _hf_checkpoint(d: Path) -> Path:
    """A Hugging Face Trainer ``checkpoint-N/`` folder: safetensors weights, torch zip optimizer state and
    training arguments, a config (written the way those libraries write them; no torch needed)."""
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"model_type": "tiny", "hidden_size": 2}))
    header = json.dumps({"__metadata__": {"format": "pt"},
                         "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    for name, obj in (("optimizer.pt", {"state": {}, "param_groups": [{"lr": 0.1}]}),
                      ("training_args.bin", {"output_dir": "out", "learning_rate": 0.1})):
        with zipfile.ZipFile(d / name, "w") as z:
            z.writestr("archive/data.pkl", pickle.dumps(obj, protocol=2))
            z.writestr("archive/version", "3\n")
    return d


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A vault with a full snapshot of a small venv that has the stamping hook, and a second venv."""
    from fixtures import make_venv

    root = tmp_path_factory.mktemp("inputs")
    vault = root / "vault"
    venv = make_venv(root / "train", "venv", BASE_PYTHON)
    other = make_venv(root / "other", "venv", BASE_PYTHON)
    for v in (venv, other):
        ev(vault, "torch", "install-hook", "--venv", v, env=_env(vault))
    sid = ev_json(vault, "snap", "--venv", venv, "--no-caches", env=_env(vault))["id"]
    return {"root": root, "vault": vault, "venv": venv, "other": other, "sid": sid}


# -- 11: not a virtual environment ------------------------------------------------------------------


def _no_cfg(root: Path) -> Path:
    from fixtures import make_venv

    v = make_venv(root / "nocfg", "venv", BASE_PYTHON)
    (v / "pyvenv.cfg").unlink()
    return v


def _conda_like(root: Path) -> Path:
    p = root / "condalike"
    (p / "bin").mkdir(parents=True)
    (p / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (p / "conda-meta").mkdir()
    (p / "bin" / "python").symlink_to(BASE_PYTHON)
    return p


def _wrapped(root: Path) -> Path:
    """A venv whose bin/python is a wrapper that runs the base interpreter: it reports the base's prefix."""
    from fixtures import make_venv

    v = make_venv(root / "wrapped", "venv", BASE_PYTHON)
    for name in ("python", "python3", "python3.11"):
        (v / "bin" / name).unlink()
    (v / "bin" / "python3").write_text(f'#!/bin/sh\nexec {BASE_PYTHON} "$@"\n')
    (v / "bin" / "python3").chmod(0o755)
    return v


@pytest.mark.parametrize("shape", ["no-pyvenv-cfg", "conda-like"])
def test_snap_refuses_what_is_not_a_venv(world, tmp_path, shape):
    target = {"no-pyvenv-cfg": lambda: _no_cfg(tmp_path), "conda-like": lambda: _conda_like(tmp_path)}[shape]()
    proc = _run(world["vault"], "snap", "--venv", target)
    assert proc.returncode == 2, proc
    assert_one_line_error(proc, f"{target} is not a virtual environment", "pyvenv.cfg")
    assert "runs another installation" in proc.stderr
    assert ("conda" in proc.stderr) is (shape == "conda-like")


@pytest.mark.parametrize("shape", ["usr", "pyenv-prefix"])
def test_snap_of_an_interpreters_own_prefix_is_a_system_environment(world, tmp_path, shape):
    """Issue 13: `--venv /usr` (an interpreter's own prefix) snaps what that interpreter sees, as --python does."""
    target = {"usr": Path("/usr"), "pyenv-prefix": BASE_PYTHON.parent.parent}[shape]
    proc = _run(world["vault"], "snap", "--venv", target, "--lock-only", "--no-caches", "--json")
    assert proc.returncode == 0, proc
    doc = json.loads(proc.stdout)
    assert doc["packages"] > 0, doc


def test_a_venv_whose_python_runs_another_prefix_is_refused(world, tmp_path):
    target = _wrapped(tmp_path)
    proc = _run(world["vault"], "snap", "--venv", target)
    assert proc.returncode == 2, proc
    assert_one_line_error(proc, "runs with prefix", str(BASE_PYTHON.parent.parent), "not a working virtual environment")


COMMANDS = [
    ("snap", "--venv", "{t}"),
    ("snap", "--lock-only", "--venv", "{t}"),
    ("status", "--venv", "{t}"),
    ("status", "--against", "{sid}", "--venv", "{t}"),
    ("diff", "{sid}", "current", "--venv", "{t}"),
    ("restore", "{sid}", "--venv", "{t}", "--dry-run"),
    ("list", "--venv", "{t}"),
    ("guard", "--venv", "{t}", "--yes", "--", "pip", "install", "x"),
    ("guard", "--venv", "{t}", "--show-protected"),
    ("cache", "snap", "--venv", "{t}"),
    ("cache", "list", "--where", "--venv", "{t}"),
    ("cache", "restore", "--venv", "{t}", "--dry-run"),
    ("torch", "install-hook", "--venv", "{t}"),
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(x for x in a if "{" not in x))
def test_every_command_with_venv_refuses_a_conda_like_prefix(world, tmp_path, args):
    target = _conda_like(tmp_path)
    proc = _run(world["vault"], *(a.format(t=target, sid=world["sid"][:12]) for a in args))
    assert proc.returncode == 2, proc
    assert_one_line_error(proc, f"{target} is not a virtual environment", "no pyvenv.cfg")


# -- 7: `current` defaults to the environment the other side names -----------------------------------


def test_diff_id_current_without_venv_means_the_snapshots_environment(world):
    for args in (("diff", world["sid"][:12], "current"), ("diff", "current", world["sid"][:12])):
        proc = _run(world["vault"], *args, "--exit-code")
        assert proc.returncode == 0, proc
        assert f"current ({world['venv']})" in proc.stdout and "no differences" in proc.stdout
    out = json.loads(_run(world["vault"], "status", "--against", world["sid"][:12], "--json").stdout)
    assert out["venv"] == str(world["venv"]) and out["snapshot"] == world["sid"]


def test_current_prefers_venv_then_the_active_venv(world):
    proc = _run(world["vault"], "diff", world["sid"][:12], "current", VIRTUAL_ENV=str(world["other"]))
    assert proc.returncode == 0 and f"current ({world['other']})" in proc.stdout, proc
    proc = _run(world["vault"], "diff", world["sid"][:12], "current", "--venv", world["other"])
    assert proc.returncode == 0 and f"current ({world['other']})" in proc.stdout, proc


def test_current_of_a_snapshot_whose_environment_is_gone(world, tmp_path):
    from fixtures import make_venv

    gone = make_venv(tmp_path / "gone", "uv")
    sid = ev_json(world["vault"], "snap", "--venv", gone, "--no-caches", env=_env(world["vault"]))["id"]
    shutil.rmtree(gone)
    proc = _run(world["vault"], "diff", sid[:12], "current")
    assert proc.returncode == 2, proc
    assert_one_line_error(proc, str(gone), "does not exist", "--venv")


# -- 13: checkpoint folders ---------------------------------------------------------------------------


def test_checkpoint_folder_is_taken_by_diff_and_restore(world, tmp_path):
    ckpt = _hf_checkpoint(tmp_path / "run" / "checkpoint-500")
    _stamp(world["venv"], world["vault"], *(ckpt / n for n in ("model.safetensors", "optimizer.pt", "training_args.bin")))
    proc = _run(world["vault"], "diff", ckpt, "current", "--exit-code")
    assert proc.returncode == 0, proc
    assert f"checkpoint-500/ ({world['sid'][:12]})" in proc.stdout and f"current ({world['venv']})" in proc.stdout
    proc = _run(world["vault"], "restore", ckpt, "--dry-run", "--json")
    assert proc.returncode == 0, proc
    out = json.loads(proc.stdout)
    assert out["restored"] == world["sid"] and out["target"] == str(world["venv"])
    proc = _run(world["vault"], "diff", ckpt / "optimizer.pt", "current", "--exit-code")
    assert proc.returncode == 0, proc  # a file of the folder still works on its own, `current` its stamp's venv
    assert f"optimizer.pt ({world['sid'][:12]})" in proc.stdout and f"current ({world['venv']})" in proc.stdout


def test_checkpoint_folder_whose_stamps_disagree(world, tmp_path):
    ckpt = _hf_checkpoint(tmp_path / "checkpoint-7")
    _stamp(world["venv"], world["vault"], ckpt / "model.safetensors", ckpt / "optimizer.pt")
    _stamp(world["other"], world["vault"], ckpt / "training_args.bin")
    other_sid = ev_json(world["vault"], "restore", ckpt / "training_args.bin", "--dry-run", env=_env(world["vault"]))["restored"]
    assert other_sid != world["sid"]
    for args in (("diff", ckpt, "current"), ("restore", ckpt, "--dry-run")):
        proc = _run(world["vault"], *args)
        assert proc.returncode == 4, proc
        assert_one_line_error(proc, "stamped with different snapshots",
                              f"model.safetensors, optimizer.pt -> {world['sid'][:12]}",
                              f"training_args.bin -> {other_sid[:12]}")
    for args in ((), ("--json",)):  # inspect shows one stamp: it says the folder is mixed (helper-16)
        proc = _run(world["vault"], "inspect", ckpt, *args)
        assert proc.returncode == 0, proc
        (warning,) = [line for line in proc.stderr.splitlines() if "stamped with different snapshots" in line]
        assert "model.safetensors, optimizer.pt -> " in warning and "training_args.bin -> " in warning, warning


def test_a_folder_stamped_before_and_after_its_full_snapshot_is_one_for_inspect_too(world, tmp_path):
    """One file stamped with the lock-only snapshot a first stamp takes, one with the full snapshot taken
    since: `restore` resolves both to the full one, and inspect, which reads no vault, does not call the
    folder mixed (helper-17)."""
    from fixtures import make_venv

    vault = world["vault"]
    fresh = make_venv(tmp_path / "fresh", "venv", BASE_PYTHON)
    ev(vault, "torch", "install-hook", "--venv", fresh, env=_env(vault))
    ckpt = _hf_checkpoint(tmp_path / "checkpoint-3")
    _stamp(fresh, vault, ckpt / "optimizer.pt")  # no snapshot of it yet: a lock-only one is taken
    full = ev_json(vault, "snap", "--venv", fresh, "--no-caches", env=_env(vault))["id"]
    _stamp(fresh, vault, ckpt / "training_args.bin")
    named = {json.loads(_run(vault, "inspect", ckpt / n, "--json").stdout)["stamp"]["snapshot"]
             for n in ("optimizer.pt", "training_args.bin")}
    assert len(named) == 2 and full in named, named
    proc = _run(vault, "restore", ckpt, "--dry-run", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["restored"] == full, proc.stderr
    proc = _run(vault, "inspect", ckpt)
    assert proc.returncode == 0 and "different snapshots" not in proc.stderr, proc.stderr


def test_checkpoint_folder_without_stamps_and_plain_folders(world, tmp_path):
    ckpt = _hf_checkpoint(tmp_path / "checkpoint-1")
    proc = _run(world["vault"], "restore", ckpt, "--dry-run")
    assert proc.returncode == 4, proc
    assert_one_line_error(proc, "checkpoint-1", "carries an envvault stamp")
    empty = tmp_path / "notes"
    empty.mkdir()
    proc = _run(world["vault"], "diff", empty, "current")
    assert proc.returncode == 4, proc
    assert_one_line_error(proc, "without checkpoint files", "no snapshot or tag has that name")


# -- 12: caches archived only for an environment that can use them ------------------------------------


def _torch_stub(venv: Path, tmp: Path) -> None:
    uv_install(venv, build_wheel(tmp / "stub", "torch", "2.13.0", {
        "torch/__init__.py": b"", "torch/version.py": b"__version__ = '2.13.0'\ncuda = None\n"}))


def test_snap_archives_inductor_cache_only_for_an_environment_with_torch(tmp_path, make_venv):
    vault = tmp_path / "vault"
    caches = {"TORCHINDUCTOR_CACHE_DIR": tmp_path / "ic", "TRITON_CACHE_DIR": tmp_path / "tc"}
    for root in caches.values():
        (root / "k").mkdir(parents=True)
        (root / "k" / "kernel.bin").write_bytes(b"compiled elsewhere")
    mine = tmp_path / "mine"
    (mine / "x").mkdir(parents=True)
    (mine / "x" / "a.bin").write_bytes(b"mine")
    env = _env(vault, **{k: str(v) for k, v in caches.items()}, TMPDIR=str(tmp_path),
               TORCH_EXTENSIONS_DIR=str(tmp_path / "no-ext"), CUDA_CACHE_PATH=str(tmp_path / "no-nv"))
    plain = make_venv("uv")
    doc = ev_json(vault, "snap", "--venv", plain, "--cache-dir", mine, env=env)
    assert [(c["kind"], c["root"]) for c in ev_json(vault, "show", doc["id"], env=env)["caches"]] == [("user", str(mine))]
    where = {r["kind"]: r["archived_by_snap"] for r in
             ev_json(vault, "cache", "list", "--where", "--venv", plain, env=env)["locations"] if r["exists"]}
    assert where == {"inductor": False, "triton": False}  # `cache list --where` tells the same
    # `cache snap` archives what it finds, whatever the environment
    assert {c["kind"] for c in ev_json(vault, "cache", "snap", "--venv", plain, env=env)["caches"]} == {"inductor", "triton"}
    _torch_stub(plain, tmp_path)
    doc = ev_json(vault, "snap", "--venv", plain, env=env)
    kinds = {c["kind"]: c["root"] for c in ev_json(vault, "show", doc["id"], env=env)["caches"]}
    assert kinds == {"inductor": str(caches["TORCHINDUCTOR_CACHE_DIR"]), "triton": str(caches["TRITON_CACHE_DIR"])}
    where = {r["kind"]: r["archived_by_snap"] for r in
             ev_json(vault, "cache", "list", "--where", "--venv", plain, env=env)["locations"] if r["exists"]}
    assert where == {"inductor": True, "triton": True}


def test_an_environment_typed_with_dotdot_is_the_same_environment(tmp_path, make_venv):
    """`--venv ../v1` from a sibling folder (helper-16): status and snap failed with an internal error
    (exit 70: the stat cache cut paths under 'train/../v1'), guard refused the install as changing another
    environment, list said "no snapshots yet"; every command now takes it as v1."""
    venv = make_venv("venv", with_pip=True, name="v1")
    work = tmp_path / "train"
    work.mkdir()
    vault = tmp_path / "vault"
    typed = "../v1"

    def run(*args, **kw):
        return ev(vault, *args, cwd=work, **kw)

    first = json.loads(run("snap", "--venv", typed, "--no-caches", "--json").stdout)
    assert first["venv"] == str(venv), first
    again = json.loads(run("snap", "--venv", typed, "--no-caches", "--json").stdout)
    status = json.loads(run("status", "--venv", typed, "--json").stdout)
    assert status["empty"] and status["venv"] == str(venv) and status["snapshot"] == again["id"], status
    listed = json.loads(run("list", "--venv", typed, "--json").stdout)["snapshots"]
    assert {s["id"] for s in listed} == {first["id"], again["id"]}, listed
    wheel = build_wheel(tmp_path / "wheels", "tiny", "1.0", {"tiny/__init__.py": b""})
    guarded = run("guard", "--venv", typed, "--yes", "--", f"{typed}/bin/python", "-m", "pip", "install", "-q",
                  "--no-index", str(wheel), check=False)
    assert guarded.returncode == 0, guarded.stderr
    assert list(venv.glob("lib/python3*/site-packages/tiny/__init__.py"))
    built = json.loads(run("restore", first["id"], "--into", "../v2", "--json").stdout)
    assert built["verified"] and built["target"] == str(tmp_path / "v2"), built


@pytest.mark.parametrize("args", [("snap",), ("status",), ("guard", "--yes", "--", "true"), ("restore", "latest"),
                                  ("diff", "latest", "current")])
def test_a_venv_path_with_a_name_too_long_is_not_a_directory(world, tmp_path, args):
    """``--venv`` with a 300-character name was a storage error ("cannot write ...: File name too long", exit
    6; helper 29): it is no directory, a usage error (exit 2) in one line."""
    target = tmp_path / ("a" * 300)
    proc = _run(world["vault"], args[0], "--venv", target, *args[1:])
    assert proc.returncode == 2, proc
    assert_one_line_error(proc, "is not a directory; pass --venv")


def test_a_venv_whose_python_is_a_link_loop_says_so(world, tmp_path):
    """``bin/python`` a symlink loop beside a ``pyvenv.cfg``: the line said "no bin/python and no pyvenv.cfg"
    (helper 29). It says the venv's interpreter does not run, and how to recreate it."""
    target = tmp_path / "loop"
    (target / "bin").mkdir(parents=True)
    (target / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (target / "bin" / "python").symlink_to("python3")
    (target / "bin" / "python3").symlink_to("python")
    proc = _run(world["vault"], "snap", "--venv", target)
    assert proc.returncode == 2, proc
    assert_one_line_error(proc, "is a venv whose bin/python does not run", "recreate it")


@pytest.mark.parametrize("args", [
    ("restore", "SID", "--into", ""), ("cache", "restore", "SID", "--to", ""), ("snap", "--cache-dir", ""),
    ("status", "--venv", ""), ("export", "SID", "-o", ""), ("--vault", "", "list"),
])
def test_an_empty_path_is_refused_before_anything_runs(world, args):
    """A script whose variable is unset passes ``""``: ``restore ID --into ""`` restored in place (exit 0),
    ``cache restore --to ""`` ignored it, ``snap --cache-dir ""`` archived the working folder (helper 31).
    Every path option refuses an empty value (exit 2), naming the option; nothing is snapped or restored."""
    before = ev_json(world["vault"], "list", "--all", env=_env(world["vault"]))["snapshots"]
    args = tuple(world["sid"] if a == "SID" else a for a in args)
    proc = _run(world["vault"], *args, **({"VIRTUAL_ENV": str(world["venv"])} if "snap" in args else {}))
    assert proc.returncode == 2, proc
    assert "an empty path" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert ev_json(world["vault"], "list", "--all", env=_env(world["vault"]))["snapshots"] == before


def test_commands_in_a_working_folder_deleted_since(world, tmp_path):
    """In a working folder deleted under the shell: ``snap`` failed with "cannot write a file: No such file or
    directory" (exit 6, no file named; the cache discovery asked for the working folder), and so did guard,
    which the shell hook runs for every install (helper 31). A snap works; guard says what to do (exit 2)."""
    import sys

    gone = tmp_path / "gone"
    gone.mkdir()
    ev_cmd = f"{sys.executable} -m envvault"

    def run_there(args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", "-c", f"cd {gone} && rmdir {gone} && exec {ev_cmd} {args}"],
                              env=_env(world["vault"]), capture_output=True, text=True, timeout=120)

    proc = run_there(f"snap --venv {world['venv']} --json")
    assert proc.returncode == 0, proc.stderr
    gone.mkdir()
    proc = run_there(f"guard --venv {world['venv']} -- true")
    assert proc.returncode == 2, proc
    assert_one_line_error(proc, "the working folder no longer exists")


def test_an_empty_list_of_an_environment_names_the_snap_of_that_environment(world, tmp_path, make_venv):
    """``list --venv V`` (or ``--python``) of an environment with no snapshot hinted a plain ``envvault snap``,
    which snaps another one (helper 31): the hint names the same environment."""
    other = make_venv("uv", name="fresh")
    proc = _run(world["vault"], "list", "--venv", other)
    assert proc.returncode == 0 and f"snap --venv {other}`" in proc.stderr, proc.stderr
