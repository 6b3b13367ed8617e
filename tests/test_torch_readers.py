"""Checkpoint readers and stamp writers against files written by real torch 2.13 (CPU).

torch is imported at module level on purpose: without it these tests must fail, not skip. The reader
itself must not need torch; ``test_reader_runs_without_torch`` proves that in a torch-less interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest
import torch  # a missing torch must fail this module, not skip it
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from envvault.errors import CorruptError, NotFoundError, RefusedError, StorageError, UsageError  # noqa: E402
from envvault.torch.checkpoint import to_jsonable
from envvault.torch.directories import read_checkpoint  # noqa: E402
from envvault.torch.stamp_io import add_zip_record, set_safetensors_metadata, write_sidecar  # noqa: E402
from fixtures.checkpoints import (  # noqa: E402
    EXPECTED_CALLS,
    HOSTILE_KINDS,
    hostile_pickle,
    legacy_with_pickle,
    torch_zip_with_pickle,
)
from fixtures.machine import cpython  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

STAMP = {"format": 1, "snapshot": "8f" * 32, "torch": str(torch.__version__), "host": "test"}
NO_TORCH_PYTHON = os.environ.get("ENVVAULT_NOTORCH_PYTHON") or str(cpython("3.12"))


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4),
                               torch.nn.BatchNorm1d(4))


def _expected(tensors) -> tuple[int, int, int]:
    tensors = list(tensors)
    return len(tensors), sum(t.numel() for t in tensors), sum(t.numel() * t.element_size() for t in tensors)


def _summary(info) -> tuple[int, int, int]:
    return info.tensors.count, info.tensors.elements, info.tensors.bytes


def test_torch_is_the_pinned_cpu_build():
    assert torch.__version__.startswith("2.13.0"), torch.__version__


def test_dict_checkpoint_with_args_config_epoch_and_stamp(tmp_path):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 7,
            "args": argparse.Namespace(lr=1e-3, batch_size=32, name="run-1"),
            "config": {"layers": [8, 16, 4], "dropout": 0.1, "tags": ("a", "b")}, "envvault": dict(STAMP)}
    path = tmp_path / "ckpt.pt"
    torch.save(ckpt, path)

    info = read_checkpoint(path)
    assert info.format == "torch-zip"
    assert info.stamp.to_dict() == STAMP and info.stamp_source == "key"
    assert info.findings == ()
    c = info.content
    assert c["epoch"] == 7
    assert c["args"] == {"object": "argparse.Namespace", "state": {"lr": 1e-3, "batch_size": 32, "name": "run-1"}}
    assert c["config"] == {"layers": [8, 16, 4], "dropout": 0.1, "tags": ["a", "b"]}
    assert c["model"]["0.weight"] == {"tensor": [16, 8], "dtype": "float32"}
    assert c["model"]["3.num_batches_tracked"] == {"tensor": [], "dtype": "int64"}
    assert c["optimizer"]["param_groups"][0]["lr"] == 1e-3
    real = list(model.state_dict().values()) + [t for s in opt.state_dict()["state"].values()
                                                for t in s.values() if isinstance(t, torch.Tensor)]
    assert _summary(info) == _expected(real)
    json.dumps(info.to_dict())  # the whole document is plain JSON


def test_bare_state_dict_stamped_through_zip_record_still_loads(tmp_path):
    model = _model()
    path = tmp_path / "weights.pt"
    torch.save(model.state_dict(), path)
    before = {i.filename: (i.header_offset, i.file_size, i.CRC) for i in zipfile.ZipFile(path).infolist()}

    name = add_zip_record(path, data=json.dumps(STAMP).encode())
    assert name == "weights/extra/envvault.json"

    zf = zipfile.ZipFile(path)
    assert zf.testzip() is None
    after = {i.filename: (i.header_offset, i.file_size, i.CRC) for i in zf.infolist()}
    assert {k: after[k] for k in before} == before  # every old entry untouched
    rec = zf.getinfo(name)
    assert rec.compress_type == zipfile.ZIP_STORED
    raw = path.read_bytes()
    name_len, extra_len = struct.unpack_from("<HH", raw, rec.header_offset + 26)  # the local header's own
    data_offset = rec.header_offset + 30 + name_len + extra_len
    assert data_offset % 64 == 0 and json.loads(raw[data_offset : data_offset + rec.file_size]) == STAMP

    for weights_only in (True, False):
        for mmap in (False, True):
            loaded = torch.load(path, weights_only=weights_only, mmap=mmap)
            fresh = _model()
            fresh.load_state_dict(loaded, strict=True)
            assert all(torch.equal(a, b) for a, b in zip(loaded.values(), model.state_dict().values()))

    info = read_checkpoint(path)
    assert info.stamp.to_dict() == STAMP and info.stamp_source == "zip-record"
    assert "envvault" not in info.content  # the state dict itself stays untouched
    assert _summary(info) == _expected(model.state_dict().values())
    assert info.notes == ()

    # Re-stamping replaces the record (it is the last one) instead of adding a second.
    add_zip_record(path, data=json.dumps({**STAMP, "snapshot": "5e" * 32}).encode())
    assert zipfile.ZipFile(path).namelist().count(name) == 1
    assert read_checkpoint(path).stamp.snapshot == "5e" * 32
    assert torch.load(path, weights_only=True, mmap=True).keys() == model.state_dict().keys()


def test_zip_record_not_last_is_refused(tmp_path):
    path = tmp_path / "w.pt"
    torch.save({"a": torch.ones(2)}, path)
    add_zip_record(path, data=b"{}")
    add_zip_record(path, "extra/other.json", data=b"{}")
    with pytest.raises(RefusedError):
        add_zip_record(path, data=b'{"x": 1}')
    assert torch.load(path, weights_only=True)["a"].sum() == 2


def test_stamp_writers_refuse_what_they_cannot_stamp(tmp_path):
    legacy = tmp_path / "legacy.pt"
    torch.save({"a": torch.ones(2)}, legacy, _use_new_zipfile_serialization=False)
    original = legacy.read_bytes()
    with pytest.raises(UsageError):
        add_zip_record(legacy, data=b"{}")
    with pytest.raises(NotFoundError):
        add_zip_record(tmp_path / "missing.pt", data=b"{}")
    with pytest.raises(CorruptError):
        set_safetensors_metadata(legacy, "envvault", "{}")
    with pytest.raises(UsageError):
        write_sidecar(tmp_path, {"not": object()})
    assert legacy.read_bytes() == original
    assert sorted(p.name for p in tmp_path.iterdir()) == ["legacy.pt"]  # no temp files left behind


def test_a_failed_stamp_write_leaves_the_checkpoint_as_it_was(tmp_path, monkeypatch):
    import envvault.torch.stamp_io as stamp_io

    path = tmp_path / "w.pt"
    torch.save({"a": torch.ones(4)}, path)
    st = tmp_path / "w.safetensors"
    save_file({"a": torch.ones(4)}, st)
    before = {p: p.read_bytes() for p in (path, st)}

    def disk_full(src, dst, start, length):
        dst.write(b"x" * 10)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(stamp_io, "_copy_range", disk_full)
    with pytest.raises(StorageError, match="No space left"):
        add_zip_record(path, data=b"{}")
    with pytest.raises(StorageError, match="No space left"):
        set_safetensors_metadata(st, "envvault", "{}")
    assert {p: p.read_bytes() for p in (path, st)} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.pt", "w.safetensors"]


def test_whole_module_pickle_is_a_record_tree(tmp_path):
    model = _model()
    path = tmp_path / "model.pt"
    torch.save(model, path)

    info = read_checkpoint(path)
    assert info.format == "torch-zip" and info.findings == ()
    root = info.content
    assert root["object"] == "torch.nn.modules.container.Sequential"
    first = root["state"]["_modules"]["0"]
    assert first["object"] == "torch.nn.modules.linear.Linear"
    assert first["state"]["_parameters"]["weight"] == {"tensor": [16, 8], "dtype": "float32", "kind": "parameter"}
    bn = root["state"]["_modules"]["3"]["state"]
    assert bn["_buffers"]["running_mean"] == {"tensor": [4], "dtype": "float32"}
    assert "torch.nn.modules.linear.Linear" in info.globals
    assert _summary(info) == _expected(model.state_dict().values())


def test_legacy_format(tmp_path):
    model = _model()
    path = tmp_path / "legacy.pt"
    torch.save({"model": model.state_dict(), "epoch": 3, "envvault": dict(STAMP)}, path,
               _use_new_zipfile_serialization=False)
    assert not zipfile.is_zipfile(path)

    info = read_checkpoint(path)
    assert info.format == "torch-legacy"
    assert info.stamp.to_dict() == STAMP and info.content["epoch"] == 3
    assert info.content["model"]["2.weight"] == {"tensor": [4, 16], "dtype": "float32"}
    assert _summary(info) == _expected(model.state_dict().values())

    whole = tmp_path / "legacy-model.pt"
    torch.save(model, whole, _use_new_zipfile_serialization=False)
    info = read_checkpoint(whole)
    assert info.format == "torch-legacy" and info.findings == ()
    assert info.content["object"] == "torch.nn.modules.container.Sequential"
    assert _summary(info) == _expected(model.state_dict().values())


def test_safetensors_metadata_stamp(tmp_path):
    tensors = {"embed.weight": torch.randn(10, 4), "head.bias": torch.zeros(3, dtype=torch.bfloat16),
               "step": torch.tensor([5], dtype=torch.int64)}
    path = tmp_path / "model.safetensors"
    save_file(tensors, path, metadata={"format": "pt", "note": "kept"})

    set_safetensors_metadata(path, "envvault", json.dumps(STAMP))
    raw = path.read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    assert header_len % 8 == 0
    with safe_open(path, framework="pt") as f:
        assert f.metadata() == {"format": "pt", "note": "kept", "envvault": json.dumps(STAMP)}
        for name, t in tensors.items():
            assert torch.equal(f.get_tensor(name), t)

    info = read_checkpoint(path)
    assert info.format == "safetensors"
    assert info.stamp.to_dict() == STAMP and info.stamp_source == "safetensors-metadata"
    assert info.content["embed.weight"] == {"tensor": [10, 4], "dtype": "float32"}
    assert info.content["head.bias"] == {"tensor": [3], "dtype": "bfloat16"}
    assert _summary(info) == _expected(tensors.values())
    assert info.tensors.storage_bytes == info.tensors.bytes

    bare = tmp_path / "bare.safetensors"
    save_file(tensors, bare)  # no metadata at all: "format": "pt" gets added with the stamp
    set_safetensors_metadata(bare, "envvault", "{}")
    with safe_open(bare, framework="pt") as f:
        assert f.metadata() == {"format": "pt", "envvault": "{}"}
        assert torch.equal(f.get_tensor("embed.weight"), tensors["embed.weight"])


def test_dcp_directory_with_sidecar(tmp_path):
    model = _model()
    d = tmp_path / "dcp"
    dcp.save({"model": model.state_dict(), "step": 11}, checkpoint_id=str(d))
    write_sidecar(d, STAMP)
    info = read_checkpoint(d)
    assert info.format == "dcp"
    assert info.stamp.to_dict() == STAMP and info.stamp_source == "envvault.json"
    assert info.content["model.0.weight"] == {"tensor": [16, 8], "dtype": "float32"}
    assert info.content["step"] == 11
    assert [f.name for f in info.files] == ["__0_0.distcp"]
    count, elements, nbytes = _expected(model.state_dict().values())
    assert (info.tensors.count, info.tensors.elements) == (count, elements)


def test_hf_style_directory(tmp_path):
    model = _model()
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "toy", "hidden_size": 16}))
    names = sorted(sd)
    save_file({k: sd[k] for k in names[:3]}, d / "model-00001-of-00002.safetensors", metadata={"format": "pt"})
    save_file({k: sd[k] for k in names[3:]}, d / "model-00002-of-00002.safetensors", metadata={"format": "pt"})
    weight_map = {k: f"model-0000{1 if i < 3 else 2}-of-00002.safetensors" for i, k in enumerate(names)}
    index = {"metadata": {"total_size": 1}, "weight_map": weight_map}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    torch.save(sd, d / "pytorch_model.bin")
    set_safetensors_metadata(d / "model-00001-of-00002.safetensors", "envvault", json.dumps(STAMP))

    info = read_checkpoint(d)
    assert info.format == "hf-dir"
    assert info.stamp.to_dict() == STAMP and info.stamp_source == "model-00001-of-00002.safetensors"
    assert info.content["config.json"]["model_type"] == "toy"
    assert info.content["model.safetensors.index.json"]["tensors"] == len(names)
    assert [(f.name, f.format) for f in info.files] == [
        ("model-00001-of-00002.safetensors", "safetensors"), ("model-00002-of-00002.safetensors", "safetensors"),
        ("pytorch_model.bin", "torch-zip")]
    assert info.tensors.count == 2 * len(sd)
    write_sidecar(d, {**STAMP, "snapshot": "d1" * 32})
    assert read_checkpoint(d).stamp_source == "envvault.json"


def _hostile_files(tmp_path: Path, real_zip: Path, marker_dir: Path) -> list[tuple[str, Path, Path]]:
    out = []
    for kind in HOSTILE_KINDS:
        slug = kind.replace(".", "_")
        for container in ("zip", "legacy"):
            marker = marker_dir / f"pwned-{slug}-{container}"
            payload = hostile_pickle(kind, marker)
            path = tmp_path / f"evil_{slug}_{container}.pt"
            if container == "zip":
                torch_zip_with_pickle(real_zip, path, payload)
            else:
                path.write_bytes(legacy_with_pickle(payload))
            out.append((kind, path, marker))
    return out


@pytest.fixture
def real_zip(tmp_path) -> Path:
    path = tmp_path / "real.pt"
    torch.save({"model": _model().state_dict(), "epoch": 1}, path)
    return path


def test_hostile_pickles_are_reported_and_never_run(tmp_path, real_zip):
    files = _hostile_files(tmp_path, real_zip, tmp_path)
    for kind, path, marker in files:
        info = read_checkpoint(path)
        assert info.format == ("torch-zip" if zipfile.is_zipfile(path) else "torch-legacy")
        assert not marker.exists(), f"{kind}: payload ran"
        text = [str(f) for f in info.findings]
        assert any(EXPECTED_CALLS[kind] in t and "tries to call" in t for t in text), (kind, text)
        assert all(f.severity == "danger" for f in info.findings)
        assert str(marker) in " ".join(text)  # the finding shows what the call would have done
        assert info.content["epoch"] == 1
        assert info.content["x"]["blocked"] is True
        json.dumps(info.to_dict())
    # Positive control: the same files are live exploits for torch.load(weights_only=False).
    control = tmp_path / "control"
    control.mkdir()
    live = _hostile_files(control, real_zip, control)
    script = "import sys, torch\nfor p in sys.argv[1:]:\n    torch.load(p, weights_only=False)\n"
    subprocess.run([sys.executable, "-c", script, *(str(p) for _, p, _ in live)], check=True, timeout=300)
    deadline = time.monotonic() + 10  # Popen does not wait for its child
    while not all(m.exists() for _, _, m in live) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [m.name for _, _, m in live if not m.exists()] == [], "payloads that did not fire under torch.load"


def test_damaged_files_give_one_line_corrupt_errors(tmp_path, real_zip):
    full = real_zip.read_bytes()
    legacy = tmp_path / "legacy.pt"
    torch.save({"a": torch.ones(3)}, legacy, _use_new_zipfile_serialization=False)
    st = tmp_path / "t.safetensors"
    save_file({"a": torch.ones(3)}, st)
    cases = {
        "garbage.pt": b"\x00not a checkpoint" + bytes(range(256)) * 16,
        "empty.pt": b"",
        "half.pt": full[: len(full) // 2],
        "headless.pt": full[100:],
        "legacy-cut.pt": legacy.read_bytes()[:60],
        "st-cut.safetensors": st.read_bytes()[:40],
        "bad-pickle.pkl": b"\x80\x02}q\x00(X\x01\x00",
    }
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(CorruptError) as exc:
            read_checkpoint(path)
        msg = str(exc.value)
        assert "\n" not in msg and str(path) in msg and len(msg) < 400, (name, msg)
        assert exc.value.exit_code == 5


def test_to_jsonable_bounds_cycles_and_depth():
    a: list = []
    a.append(a)
    assert to_jsonable(a) == ["…"]
    deep: list = []
    node = deep
    for _ in range(500):
        node.append([])
        node = node[0]
    json.dumps(to_jsonable(deep))


def _no_torch_python() -> list[str]:
    if Path(NO_TORCH_PYTHON).exists():
        return [NO_TORCH_PYTHON]
    return [sys.executable, "-S"]  # this interpreter without site-packages: no torch either


def test_reader_runs_without_torch(tmp_path, real_zip):
    model = _model()
    files = []
    for name, obj, kw in [("dict.pt", {"model": model.state_dict(), "epoch": 2, "envvault": STAMP}, {}),
                          ("module.pt", model, {}),
                          ("legacy.pt", {"model": model.state_dict()}, {"_use_new_zipfile_serialization": False})]:
        torch.save(obj, tmp_path / name, **kw)
        files.append(tmp_path / name)
    save_file({"w": torch.ones(2)}, tmp_path / "w.safetensors", metadata={"format": "pt"})
    files.append(tmp_path / "w.safetensors")
    files += [p for _, p, _ in _hostile_files(tmp_path, real_zip, tmp_path)]
    dcp.save({"m": model.state_dict()}, checkpoint_id=str(tmp_path / "dcp"))
    files.append(tmp_path / "dcp")
    python = _no_torch_python()

    probe = subprocess.run([*python, "-c", "import importlib.util as u; print(u.find_spec('torch') is None)"],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "True", f"{python} can import torch; it cannot prove anything"

    script = textwrap.dedent("""
        import json, sys
        from envvault.torch.directories import read_checkpoint
        out = {p: read_checkpoint(p).to_dict() for p in sys.argv[1:]}
        third_party = sorted(m for m in sys.modules if m.split(".")[0] not in sys.stdlib_module_names
                             and m.split(".")[0] not in ("envvault", "__main__"))
        print(json.dumps({"docs": out, "third_party": third_party}))
        """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run([*python, "-c", script, *map(str, files)], capture_output=True, text=True, env=env,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["third_party"] == []
    docs = result["docs"]
    assert docs[str(tmp_path / "dict.pt")]["stamp"] == STAMP
    assert docs[str(tmp_path / "module.pt")]["content"]["object"] == "torch.nn.modules.container.Sequential"
    assert docs[str(tmp_path / "legacy.pt")]["format"] == "torch-legacy"
    assert docs[str(tmp_path / "w.safetensors")]["tensors"]["count"] == 1
    assert docs[str(tmp_path / "dcp")]["format"] == "dcp"
    for kind, path, marker in _hostile_files(tmp_path, real_zip, tmp_path):
        assert any(EXPECTED_CALLS[kind] in f for f in docs[str(path)]["findings"])
        assert not marker.exists()


def test_one_gigabyte_checkpoints_read_small(tmp_path):
    """~1 GiB checkpoints (zip with 1000 tensors and optimizer state; legacy) are read whole by a torch-less
    interpreter in under 100 MB peak RSS, without reading tensor bytes. (A safetensors file costs the same at
    any size: only its JSON header is read.) Wall time is a figure, not a test: bench/bench_stamp.py."""
    big = {f"layer{i}.weight": torch.empty(8192, 4096) for i in range(8)}  # 8 x 128 MiB float32
    # An Adam checkpoint's layout (model + step/exp_avg/exp_avg_sq per parameter), without Adam's compute.
    groups = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))]).state_dict()["param_groups"]
    groups[0]["params"] = list(range(250))
    state = {i: {"step": torch.tensor(1.0), "exp_avg": torch.empty(256, 1365), "exp_avg_sq": torch.empty(256, 1365)}
             for i in range(250)}
    many = {"model": {f"blocks.{i}.w": torch.empty(256, 1365) for i in range(250)},
            "optimizer": {"state": state, "param_groups": groups}, "epoch": 3, "envvault": STAMP}
    paths = {tmp_path / "many.pt": 3 * 250 * 256 * 1365 * 4 + 250 * 4, tmp_path / "big-legacy.pt": 2**30}
    torch.save(many, tmp_path / "many.pt")
    torch.save(big, tmp_path / "big-legacy.pt", _use_new_zipfile_serialization=False)
    del big, many, state
    assert all(p.stat().st_size > 1_000_000_000 for p in paths)
    script = textwrap.dedent("""
        import json, sys
        from envvault.torch.directories import read_checkpoint
        doc = read_checkpoint(sys.argv[1]).to_dict()
        json.dumps(doc)
        # VmHWM is this process image's peak RSS; ru_maxrss would include the forking pytest's.
        hwm = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
        print(json.dumps({"bytes": doc["tensors"]["bytes"], "rss_mb": int(hwm.split()[1]) / 1024}))
        """)
    for path, expected_bytes in paths.items():
        run = subprocess.run([*_no_torch_python(), "-c", script, str(path)], capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)}, check=True)
        doc = json.loads(run.stdout)
        assert doc["bytes"] == expected_bytes
        assert doc["rss_mb"] < 100, f"{path.name}: {doc['rss_mb']:.0f} MB"
        path.unlink()  # pytest keeps recent tmp dirs; do not leave gigabytes behind
