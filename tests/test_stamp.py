"""Checkpoint stamps written by real torch 2.13 (CPU): where they go, what they say, and that every
checkpoint still loads (weights_only True and False, mmap, strict state_dict loading).

torch is imported at module level on purpose: without it these tests fail, never skip. In-process tests
stamp the interpreter running pytest (its environment is scanned lock-level into a temporary vault, no
files are vaulted); drift and concurrency run real processes in small venvs that import torch from the
``torch_venv`` fixture.
"""

from __future__ import annotations

import io
import json
import logging
import os
import struct
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest
import safetensors.torch
import torch  # a missing torch must fail this module, not skip it
import torch.distributed.checkpoint as dcp
from safetensors import safe_open

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from envvault.torch import environment, naming, plugin, stamp_doc  # noqa: E402
from envvault.torch.directories import read_checkpoint  # noqa: E402
from envvault.torch.hook import link_runtime  # noqa: E402
from envvault.vault.store import Vault  # noqa: E402
from fixtures import build_wheel, make_venv, site_packages, uv_install  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

STAMP_FIELDS = {"format", "tool", "snapshot", "snapshot_lock_only", "vault", "fingerprint", "venv", "torch", "cuda",
                "python", "executable", "host", "argv", "git", "env", "warnings", "drift", "time", "cwd"}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4),
                               torch.nn.BatchNorm1d(4))


def _plain(value) -> bool:
    if isinstance(value, dict):
        return all(type(k) is str and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return value is None or type(value) in (str, int, float, bool)


def _record(path: Path) -> dict | None:
    zf = zipfile.ZipFile(path)
    names = [n for n in zf.namelist() if n.endswith("/extra/envvault.json")]
    return json.loads(zf.read(names[0])) if names else None


@pytest.fixture(scope="module")
def vault_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("stamps") / "vault"


@pytest.fixture
def stamping(vault_dir):
    plugin.enable(vault=vault_dir, full_snapshot=False)
    try:
        yield vault_dir
    finally:
        plugin.disable()


def _check_stamp(s: dict, vault_dir: Path) -> None:
    assert set(s) == STAMP_FIELDS, set(s) ^ STAMP_FIELDS
    assert _plain(s)
    vault = Vault.open(vault_dir)
    doc = vault.load_snapshot(s["snapshot"]).doc  # the snapshot exists
    assert doc["fingerprint"] == s["fingerprint"] and doc["venv"] == sys.prefix
    assert s["snapshot_lock_only"] is True and doc["lock_only"] is True and doc["trigger"] == "stamp"
    assert s["vault"] == str(vault.root)
    assert s["torch"] == str(torch.__version__) and s["cuda"] == torch.version.cuda
    assert s["python"] == "%d.%d.%d" % sys.version_info[:3] and s["executable"] == sys.executable
    assert s["venv"] == sys.prefix and s["argv"] == sys.argv and s["cwd"] == os.getcwd()
    assert s["drift"] is None and s["warnings"] == []
    assert time.strptime(s["time"][:19], "%Y-%m-%dT%H:%M:%S")


def test_dict_checkpoint_gets_a_plain_key_and_still_loads(stamping, tmp_path):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 7,
            "config": {"layers": [8, 16, 4], "dropout": 0.1}}
    path = tmp_path / "ckpt.pt"
    torch.save(ckpt, path)
    assert "envvault" not in ckpt  # the caller's dict is not changed

    stamps = []
    for weights_only in (True, False):
        for mmap in (False, True):
            loaded = torch.load(path, weights_only=weights_only, mmap=mmap)
            fresh = _model()
            fresh.load_state_dict(loaded["model"], strict=True)
            torch.optim.AdamW(fresh.parameters()).load_state_dict(loaded["optimizer"])
            assert loaded["epoch"] == 7 and loaded["config"] == ckpt["config"]
            stamps.append(loaded["envvault"])
    assert all(s == stamps[0] for s in stamps)
    _check_stamp(stamps[0], stamping)
    info = read_checkpoint(path)
    assert info.stamp.to_dict() == stamps[0] and info.stamp_source == "key" and _record(path) is None


def test_bare_state_dicts_and_whole_modules_get_a_zip_record(stamping, tmp_path):
    model = _model()
    torch.save({"epoch": 1}, tmp_path / "first.pt")
    snapshot = torch.load(tmp_path / "first.pt")["envvault"]["snapshot"]
    state = model.state_dict()
    plain = {k: v.clone() for k, v in state.items()}  # all values tensors, no _metadata
    mixed = {"weight": torch.ones(2), "_extra_state": 5}  # a state_dict with non-tensor extra state
    for name, obj in (("sd.pt", state), ("plain.pt", plain), ("mixed.pt", mixed), ("module.pt", model)):
        torch.save(obj, tmp_path / name)
        s = _record(tmp_path / name)
        assert s is not None and s["snapshot"] == snapshot, name
        _check_stamp(s, stamping)
        info = read_checkpoint(tmp_path / name)
        assert info.stamp.to_dict() == s and info.stamp_source == "zip-record"
        # torch's own writer put the record in: 64-byte aligned like every other record.
        rec = next(i for i in zipfile.ZipFile(tmp_path / name).infolist() if i.filename.endswith("envvault.json"))
        raw = (tmp_path / name).read_bytes()
        name_len, extra_len = struct.unpack_from("<HH", raw, rec.header_offset + 26)
        assert (rec.header_offset + 30 + name_len + extra_len) % 64 == 0
    for name in ("sd.pt", "plain.pt"):
        for weights_only in (True, False):
            for mmap in (False, True):
                loaded = torch.load(tmp_path / name, weights_only=weights_only, mmap=mmap)
                assert "envvault" not in loaded
                _model().load_state_dict(loaded, strict=True)
                assert all(torch.equal(loaded[k], v) for k, v in state.items())
    assert torch.load(tmp_path / "mixed.pt", weights_only=True).keys() == mixed.keys()
    for mmap in (False, True):
        module = torch.load(tmp_path / "module.pt", weights_only=False, mmap=mmap)
        assert type(module) is type(model)
        assert all(torch.equal(a, b) for a, b in zip(module.state_dict().values(), state.values()))


def test_file_objects_are_stamped_in_the_same_save(stamping):
    model = _model()
    for obj in ({"model": model.state_dict(), "step": 3}, model.state_dict()):
        buf = io.BytesIO()
        torch.save(obj, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=True)
        s = loaded.pop("envvault") if "step" in loaded else json.loads(
            zipfile.ZipFile(io.BytesIO(buf.getvalue())).read("archive/extra/envvault.json"))
        _check_stamp(s, stamping)
        _model().load_state_dict(loaded.get("model", loaded), strict=True)


def test_legacy_format_dicts_get_the_key_other_objects_a_warning(stamping, tmp_path, caplog):
    model = _model()
    torch.save({"model": model.state_dict(), "epoch": 2}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    for weights_only in (True, False):
        loaded = torch.load(tmp_path / "legacy.pt", weights_only=weights_only)
        _model().load_state_dict(loaded["model"], strict=True)
        _check_stamp(loaded["envvault"], stamping)
    info = read_checkpoint(tmp_path / "legacy.pt")
    assert info.format == "torch-legacy" and info.stamp_source == "key"

    with caplog.at_level(logging.WARNING, logger="envvault"):
        torch.save(model.state_dict(), tmp_path / "legacy-sd.pt", _use_new_zipfile_serialization=False)
    assert any("legacy format" in r.getMessage() and r.name == "envvault" for r in caplog.records)
    assert read_checkpoint(tmp_path / "legacy-sd.pt").stamp is None
    _model().load_state_dict(torch.load(tmp_path / "legacy-sd.pt", weights_only=True), strict=True)


def test_safetensors_metadata_keeps_format_pt(stamping, tmp_path):
    tensors = {"w": torch.ones(2, 3), "b": torch.zeros(3)}
    safetensors.torch.save_file(tensors, tmp_path / "a.safetensors")
    safetensors.torch.save_file(tensors, tmp_path / "b.safetensors", metadata={"step": "3"})
    safetensors.torch.save_model(torch.nn.Linear(3, 2), str(tmp_path / "m.safetensors"))
    raw = safetensors.torch.save(tensors)
    for path in ("a", "b", "m"):
        with safe_open(tmp_path / f"{path}.safetensors", framework="pt") as f:
            meta = f.metadata()
        assert meta["format"] == "pt"
        _check_stamp(json.loads(meta["envvault"]), stamping)
        info = read_checkpoint(tmp_path / f"{path}.safetensors")
        assert info.stamp.to_dict() == json.loads(meta["envvault"]) and info.stamp_source == "safetensors-metadata"
    with safe_open(tmp_path / "b.safetensors", framework="pt") as f:
        assert f.metadata()["step"] == "3"
    loaded = safetensors.torch.load_file(tmp_path / "a.safetensors")
    assert all(torch.equal(loaded[k], v) for k, v in tensors.items())
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    assert header["__metadata__"]["format"] == "pt" and "envvault" in header["__metadata__"]
    assert torch.equal(safetensors.torch.load(raw)["w"], tensors["w"])


def test_distributed_checkpoint_gets_a_sidecar(stamping, tmp_path):
    state = {"model": _model().state_dict()}
    dcp.save(state, checkpoint_id=str(tmp_path / "dcp"))
    side = json.loads((tmp_path / "dcp" / "envvault.json").read_text())
    _check_stamp(side, stamping)
    info = read_checkpoint(tmp_path / "dcp")
    assert info.format == "dcp" and info.stamp.to_dict() == side
    fresh = {"model": _model().state_dict()}
    dcp.load(fresh, checkpoint_id=str(tmp_path / "dcp"))


LATE_IMPORTS = textwrap.dedent("""
    import json, sys, torch
    import envvault.torch
    envvault.torch.enable(full_snapshot=False)
    assert "safetensors.torch" not in sys.modules and "torch.distributed.checkpoint" not in sys.modules
    from safetensors.torch import save_file  # the name bound at import is already the stamping one
    import torch.distributed.checkpoint as dcp
    out = sys.argv[1]
    save_file({"w": torch.ones(2)}, out + "/w.safetensors")
    dcp.save({"m": torch.nn.Linear(2, 2).state_dict()}, checkpoint_id=out + "/dcp")
    """)


def test_writers_imported_after_enable_are_wrapped_on_import(tmp_path, vault_dir):
    run = subprocess.run([sys.executable, "-c", LATE_IMPORTS, str(tmp_path)], capture_output=True, text=True,
                         env={**os.environ, "ENVVAULT_HOME": str(vault_dir), "PYTHONPATH": str(REPO)}, timeout=600)
    assert run.returncode == 0, run.stderr
    assert read_checkpoint(tmp_path / "w.safetensors").stamp_source == "safetensors-metadata"
    assert read_checkpoint(tmp_path / "dcp").stamp_source == "envvault.json"


def test_explicit_stamp_without_enable(vault_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("ENVVAULT_HOME", str(vault_dir))
    monkeypatch.setenv("ENVVAULT_STAMP_FULL_SNAPSHOT", "0")
    model = _model()
    try:
        ckpt = {"model": model.state_dict(), "epoch": 1}
        stamped = plugin.stamp(ckpt)
        assert "envvault" not in ckpt and stamped["envvault"]["snapshot"]
        _check_stamp(stamped["envvault"], vault_dir)
        torch.save(model.state_dict(), tmp_path / "sd.pt")  # not enabled: saved unstamped
        safetensors.torch.save_file({"w": torch.ones(2)}, tmp_path / "w.safetensors")
        dcp.save({"m": model.state_dict()}, checkpoint_id=str(tmp_path / "dcp"))
        assert read_checkpoint(tmp_path / "sd.pt").stamp is None
        for target in ("sd.pt", "w.safetensors", "dcp"):
            assert plugin.stamp(tmp_path / target) == tmp_path / target
            _check_stamp(read_checkpoint(tmp_path / target).stamp.to_dict(), vault_dir)
        _model().load_state_dict(torch.load(tmp_path / "sd.pt", weights_only=True, mmap=True), strict=True)
        with pytest.raises(TypeError, match="bare state_dict"):
            plugin.stamp(model.state_dict())
        with pytest.raises(TypeError, match="Tensor"):
            plugin.stamp(torch.ones(2))
        assert plugin.current_stamp()["snapshot"] == stamped["envvault"]["snapshot"]
    finally:
        plugin.disable()


def test_disable_puts_the_original_functions_back(vault_dir, tmp_path):
    originals = (torch.save, torch.serialization.save, torch.serialization._open_zipfile_writer,
                 safetensors.torch.save_file, dcp.save)
    plugin.enable(vault=vault_dir, full_snapshot=False)
    assert torch.save is not originals[0] and safetensors.torch.save_file is not originals[3]
    plugin.disable()
    assert (torch.save, torch.serialization.save, torch.serialization._open_zipfile_writer,
            safetensors.torch.save_file, dcp.save) == originals
    torch.save({"a": 1}, tmp_path / "a.pt")
    assert "envvault" not in torch.load(tmp_path / "a.pt")


def test_a_vault_that_cannot_be_written_still_leaves_the_fingerprint(tmp_path, vault_dir, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    plugin.enable(vault=blocker / "vault", full_snapshot=False)
    try:
        with caplog.at_level(logging.WARNING, logger="envvault"):
            torch.save({"epoch": 1}, tmp_path / "a.pt")
        s = torch.load(tmp_path / "a.pt", weights_only=True)["envvault"]
    finally:
        plugin.disable()
    assert s["snapshot"] is None and s["vault"] is None
    assert s["warnings"] and "vault cannot be used" in s["warnings"][0]
    assert any("vault cannot be used" in r.getMessage() for r in caplog.records)
    plugin.enable(vault=vault_dir, full_snapshot=False)
    try:
        good = plugin.current_stamp()
    finally:
        plugin.disable()
    assert s["fingerprint"] == good["fingerprint"] is not None


def test_stamping_never_raises_into_the_training_loop(stamping, tmp_path, monkeypatch, caplog):
    def broken(*_a, **_k):
        raise RuntimeError("simulated bug")

    plugin.disable()
    monkeypatch.setattr(stamp_doc, "base_stamp", broken)
    plugin.enable(vault=stamping, full_snapshot=False)
    with caplog.at_level(logging.WARNING, logger="envvault"):
        torch.save({"epoch": 5}, tmp_path / "a.pt")
        torch.save(_model().state_dict(), tmp_path / "b.pt")
        safetensors.torch.save_file({"w": torch.ones(1)}, tmp_path / "c.safetensors")
    assert torch.load(tmp_path / "a.pt") == {"epoch": 5}
    assert _record(tmp_path / "b.pt") is None
    assert any("simulated bug" in r.getMessage() for r in caplog.records)
    # The user's own errors still reach the user, unchanged.
    with pytest.raises(AttributeError):
        torch.save({"a": 1}, object())


# --- the fingerprint ----------------------------------------------------------------------------------------


def _wheel(out: Path, name: str, version: str = "1.0") -> Path:
    return build_wheel(out, name, version, {f"{name}/__init__.py": f"VERSION = {version!r}\n".encode()})


def test_lock_level_fingerprint_equals_a_full_snapshots(tmp_path):
    from envvault.snap import take_snapshot

    venv = make_venv(tmp_path / "venv", "venv", python=sys._base_executable)
    uv_install(venv, _wheel(tmp_path / "w", "alpha"), _wheel(tmp_path / "w", "beta", "2.0"))
    sites = [site_packages(venv)]
    vault = Vault.open(tmp_path / "vault", create=True)
    full = take_snapshot(vault, venv, message="full")
    signature = environment.dist_signature(venv, sites)
    from_full_cache = environment.state_from_cache(vault, venv, signature)  # only full-scan groups so far
    assert from_full_cache is not None and from_full_cache.fingerprint == full.snapshot.fingerprint
    assert [p[0] for p in from_full_cache.packages] == ["alpha", "beta"]
    cold = environment.environment_state(Vault.open(tmp_path / "cold", create=True), venv, sites)
    assert cold.fingerprint == full.snapshot.fingerprint and cold.packages == from_full_cache.packages
    assert naming.find_snapshot(vault, cold.fingerprint) == (full.id, False)
    assert naming.find_snapshot(vault, cold.fingerprint, str(venv)) == (full.id, False)
    assert naming.find_snapshot(vault, cold.fingerprint, str(tmp_path / "a-copy-elsewhere")) is None


# --- real processes ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory, torch_venv) -> Path:
    """A venv with no distributions of its own that imports torch from ``torch_venv`` and envvault from
    this checkout (both through a .pth file), so snapshots of it are small."""
    venv = make_venv(tmp_path_factory.mktemp("light") / "venv", "venv", python=sys._base_executable)
    site = site_packages(venv)
    libs = link_runtime(site / "envvault_test.libs")
    (site / "envvault_test.pth").write_text(f"{libs}\n{site_packages(torch_venv)}\n")
    return venv


def _env(vault: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "ENVVAULT_STAMP")}
    env["ENVVAULT_HOME"] = str(vault)
    return env


DRIFT_SCRIPT = textwrap.dedent("""
    import sys, torch
    import envvault.torch
    envvault.torch.enable(full_snapshot=False)
    first, second = sys.argv[1:3]
    if first != "-":
        torch.save({"step": 1}, first)
    print("ready", flush=True)
    sys.stdin.readline()
    torch.save(torch.nn.Linear(2, 2).state_dict(), second)
    print("done", flush=True)
    """)


def _run_until_ready(venv: Path, vault: Path, tmp: Path, first: str, second: str) -> subprocess.Popen:
    proc = subprocess.Popen([str(venv / "bin" / "python"), "-c", DRIFT_SCRIPT, first, second],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(vault), cwd=tmp)
    line = proc.stdout.readline()
    assert line.strip() == "ready", proc.stderr.read()
    return proc


def _finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate("go\n", timeout=300)
    assert proc.returncode == 0 and "done" in out, err
    return err


def test_drift_names_what_was_installed_while_the_process_ran(light_venv, tmp_path):
    import shutil

    venv = tmp_path / "venv"
    shutil.copytree(light_venv, venv, symlinks=True)
    vault = tmp_path / "vault"
    proc = _run_until_ready(venv, vault, tmp_path, str(tmp_path / "a.pt"), str(tmp_path / "b.pt"))
    uv_install(venv, _wheel(tmp_path / "w", "driftpkg"))
    err = _finish(proc)
    a, b = read_checkpoint(tmp_path / "a.pt").stamp.to_dict(), read_checkpoint(tmp_path / "b.pt").stamp.to_dict()
    assert a["drift"] is None and a["snapshot"]
    assert b["snapshot"] == a["snapshot"] and b["fingerprint"] == a["fingerprint"]  # the environment it started in
    assert b["drift"]["changed"] == [{"name": "driftpkg", "old": None, "new": "1.0", "other_build": False}]
    assert b["drift"]["fingerprint"] != a["fingerprint"]
    assert "driftpkg" in err  # and a warning went to the log

    # Installed after the process started and before its first save: the start is recovered from the
    # vault's cache (that environment was read before), and no snapshot of the new state is taken for it.
    proc = _run_until_ready(venv, vault, tmp_path, "-", str(tmp_path / "c.pt"))
    uv_install(venv, _wheel(tmp_path / "w", "latepkg", "3.0"))
    _finish(proc)
    c = read_checkpoint(tmp_path / "c.pt").stamp.to_dict()
    assert c["fingerprint"] == b["drift"]["fingerprint"]
    assert c["drift"]["changed"] == [{"name": "latepkg", "old": None, "new": "3.0", "other_build": False}]
    assert c["snapshot"] is None and "changed on disk" in c["warnings"][0]
    assert len(Vault.open(vault).snapshot_ids()) == 1


CONCURRENT_SCRIPT = textwrap.dedent("""
    import os, sys, threading, time, torch
    import envvault.torch
    envvault.torch.enable()
    out, go = sys.argv[1], sys.argv[2]
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.01)
    model = torch.nn.Linear(4, 4)
    def work(t):
        for i in range(2):
            torch.save({"model": model.state_dict(), "i": i}, f"{out}-{t}-{i}-dict.pt")
            torch.save(model.state_dict(), f"{out}-{t}-{i}-sd.pt")
    threads = [threading.Thread(target=work, args=(t,)) for t in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("done", flush=True)
    """)


def _background_snaps(vault: Path) -> list[int]:
    """Pids of the running `envvault snap` processes writing to ``vault`` (started by stamping processes)."""
    pids = []
    for d in Path("/proc").iterdir():
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0") if d.name.isdigit() else []
        except OSError:  # ended meanwhile
            continue
        if str(vault).encode() in argv and b"snap" in argv:
            pids.append(int(d.name))
    return pids


def _wait_for_background_snaps(vault: Path) -> None:
    deadline = time.monotonic() + 300  # a bound on a hang, not a guess at how long a snap takes
    while _background_snaps(vault):
        assert time.monotonic() < deadline, _background_snaps(vault)
        time.sleep(0.05)


def test_eight_processes_of_three_threads_make_one_snapshot(light_venv, tmp_path):
    vault = tmp_path / "vault"
    go = tmp_path / "go"
    procs = [subprocess.Popen([str(light_venv / "bin" / "python"), "-c", CONCURRENT_SCRIPT, str(tmp_path / f"p{n}"),
                               str(go)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(vault))
             for n in range(8)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
    go.touch()
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0 and "done" in out, err
    files = sorted(tmp_path.glob("p*.pt"))
    assert len(files) == 8 * 3 * 2 * 2  # processes x threads x rounds x (dict, state_dict)
    stamps = {f.name: read_checkpoint(f).stamp for f in files}
    assert all(s is not None and s.warnings == () for s in stamps.values())
    assert len({s.fingerprint for s in stamps.values()}) == 1
    # A process keeps naming the snapshot its first stamp found: one per process.
    for n in range(8):
        assert len({s.snapshot for name, s in stamps.items() if name.startswith(f"p{n}-")}) == 1, n
    for f in files:
        loaded = torch.load(f, weights_only=True, mmap=True)
        torch.nn.Linear(4, 4).load_state_dict(loaded.get("model", loaded), strict=True)
    v = Vault.open(vault)
    docs = [v.load_snapshot(sid).doc for sid in v.snapshot_ids()]
    lock_only = [d for d in docs if d["lock_only"]]
    assert len(lock_only) == 1 and lock_only[0]["trigger"] == "stamp"
    # The one process that took it also started one full snap of the files, in the background: every
    # background snap has been started by now (the processes that start them have ended); wait until they end.
    _wait_for_background_snaps(vault)
    docs = {sid: v.load_snapshot(sid).doc for sid in v.snapshot_ids()}
    assert sorted(d["lock_only"] for d in docs.values()) == [False, True], (vault / "state" / "stamp-snap.log").read_text()
    assert len({d["fingerprint"] for d in docs.values()}) == 1
    # Every stamp names the lock-only snapshot, or (a process whose first stamp came after the background
    # snap committed) the full one, which a lock-only stamp resolves to anyway.
    assert {s.snapshot for s in stamps.values()} <= docs.keys()
    assert all(s.snapshot_lock_only == docs[s.snapshot]["lock_only"] for s in stamps.values())


STAMP_PATH_SCRIPT = textwrap.dedent("""
    import sys, torch
    import envvault.torch
    torch.manual_seed(0)
    torch.save(torch.nn.Linear(2, 2).state_dict(), sys.argv[1])  # saved before stamping is on: no stamp
    envvault.torch.enable(full_snapshot=False)
    envvault.torch.stamp(sys.argv[1])
    print("stamped", flush=True)
    """)


def test_sigkill_while_stamping_a_file_leaves_it_whole(light_venv, tmp_path):
    """Killed at the named point where the stamped copy is written but not renamed (envvault/crashpoints.py):
    the checkpoint under its name is the whole unstamped one; a rerun stamps it."""
    vault, ckpt = tmp_path / "vault", tmp_path / "ckpt" / "step.pt"
    ckpt.parent.mkdir()
    run = [str(light_venv / "bin" / "python"), "-c", STAMP_PATH_SCRIPT, str(ckpt)]
    proc = subprocess.run(run, capture_output=True, text=True, timeout=300,
                          env=dict(_env(vault), ENVVAULT_TEST_CRASH_AT="stamp_write"))
    assert proc.returncode == -9, proc.stderr  # SIGKILL
    assert [p.name for p in ckpt.parent.iterdir() if p != ckpt]  # killed mid-work: the stamped copy beside it
    assert read_checkpoint(ckpt).stamp is None
    torch.manual_seed(0)
    want = torch.nn.Linear(2, 2).state_dict()
    got = torch.load(ckpt, weights_only=True)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    proc = subprocess.run(run, capture_output=True, text=True, timeout=300, env=_env(vault))
    assert proc.returncode == 0 and "stamped" in proc.stdout, proc.stderr
    stamp = read_checkpoint(ckpt).stamp
    assert stamp is not None and stamp.snapshot in Vault.open(vault).snapshot_ids()
    torch.nn.Linear(2, 2).load_state_dict(torch.load(ckpt, weights_only=True), strict=True)
