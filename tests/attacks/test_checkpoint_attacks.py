"""Hostile checkpoints against `inspect` (and `diff`/`restore`, which read the stamp) (issue 14, item 5).

Each file is a few bytes or kilobytes (or a sparse file) crafted from the formats alone. Each run is a real
`envvault inspect` under an address-space limit and a timeout; each asserts the documented exit code, one
line on stderr when it fails, a bounded time and a peak resident memory under 100 MB.
"""

from __future__ import annotations

import json
import struct

import pytest

from tests.attacks.ckptcraft import (
    P2,
    Run,
    bare_pickle,
    mkfifo,
    rebuild_tensor,
    run_limited,
    safetensors,
    sparse_safetensors,
    torch_zip,
    unicode,
)

MAX_SECONDS = 10  # each case takes well under a second on a quiet machine; unbounded ones ran minutes
MAX_MB = 100


def _bounded(run: Run) -> None:
    assert run.seconds < MAX_SECONDS, run.seconds
    assert run.peak_mb < MAX_MB, run.peak_mb
    assert len(run.stdout) < 20 << 20, len(run.stdout)


def _refused(run: Run, code: int, *needles: str) -> None:
    _bounded(run)
    assert run.returncode == code, (run.returncode, run.stderr[-2000:])
    assert len(run.err_lines) == 1 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert run.err_lines[0].startswith("envvault: error: "), run.stderr
    for n in needles:
        assert n in run.stderr, (n, run.stderr)


def _inspect(tmp_path, path, *extra: str) -> Run:
    return run_limited(tmp_path / "vault", "inspect", str(path), *extra, cwd=tmp_path)


def test_deep_tuple_as_dict_key_is_refused(tmp_path):
    # {((((1,),),)...): 1} 300,000 deep: hashing the key recursed in C until the process segfaulted.
    pkl = P2 + b"}" + b"K\x01" + b"\x85" * 300_000 + b"K\x01s."
    ckpt = torch_zip(tmp_path / "deep.pt", pkl)
    _refused(_inspect(tmp_path, ckpt), 2, "nests tuples more than 100 deep")


def test_deep_frozenset_is_refused(tmp_path):
    # The same through protocol 4's FROZENSET opcode: frozenset({frozenset({...})}).
    body = b"K\x01"
    for _ in range(5000):
        body = b"(" + body + b"\x91"  # MARK <item> FROZENSET
    ckpt = bare_pickle(tmp_path / "sets.pkl", b"\x80\x04" + body + b".")
    _refused(_inspect(tmp_path, ckpt), 2, "nests tuples more than 100 deep")


def test_deep_list_is_bounded(tmp_path):
    # [[[[...]]]] 300,000 deep (lists are not hashed): read, rendered to depth 100, never recursed.
    pkl = P2 + b"]" * 300_000 + b"a" * 299_999 + b"."
    run = _inspect(tmp_path, bare_pickle(tmp_path / "lists.pkl", pkl), "--json")
    _bounded(run)
    assert run.returncode == 0, run.stderr
    assert "…" in json.dumps(json.loads(run.stdout)["content"], ensure_ascii=False)


def test_huge_integer_in_a_pickle_is_refused(tmp_path):
    digits = str(10**4000).encode()
    pkl = P2 + b"}" + unicode("envvault") + b"L" + digits + b"L\ns."  # text LONG, 4001 digits
    _refused(_inspect(tmp_path, torch_zip(tmp_path / "bigint.pt", pkl)), 2, "integer of more than 4096 bits")
    long4 = (1 << 20_000).to_bytes(2501, "little", signed=True)
    pkl = P2 + b"}" + unicode("n") + b"\x8b" + struct.pack("<i", len(long4)) + long4 + b"s."
    _refused(_inspect(tmp_path, torch_zip(tmp_path / "bigint4.pt", pkl)), 2, "integer of more than 4096 bits")


def test_tensor_shape_of_huge_dimensions_is_not_multiplied(tmp_path):
    # 3,000 dimensions of 2**4000 (each under the integer limit): counting elements was minutes of
    # multiplication. Not a shape: the rebuild call is recorded, never made, and nothing is multiplied.
    dims = b"\x8b" + struct.pack("<i", 501) + (1 << 4000).to_bytes(501, "little", signed=True)
    shape = b"(" + dims + b"q\x03" + b"h\x03" * 2999 + b"t"
    run = _inspect(tmp_path, torch_zip(tmp_path / "shape.pt", rebuild_tensor(shape)), "--json")
    _bounded(run)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["tensors"]["count"] == 0
    assert any("_rebuild_tensor_v2" in f for f in doc["findings"]), doc["findings"]


def test_safetensors_shape_of_huge_integers_is_refused(tmp_path):
    header = b'{"w":{"dtype":"F32","shape":[' + b",".join([str(10**4000).encode()] * 3000) + \
        b'],"data_offsets":[0,4]}}'
    _refused(_inspect(tmp_path, safetensors(tmp_path / "shape.safetensors", header, b"\0" * 4)), 5,
             "integer of 4001 digits")


def test_safetensors_header_nested_deeply_is_refused(tmp_path):
    header = b'{"__metadata__":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    _refused(_inspect(tmp_path, safetensors(tmp_path / "deep.safetensors", header)), 5, "nests deeper than")


def test_safetensors_header_over_the_limit_is_refused(tmp_path):
    # 100 MB header (sparse): read in full it took 1.8 GB and 23 s; refused before reading.
    ckpt = sparse_safetensors(tmp_path / "huge.safetensors", 100_000_000)
    _refused(_inspect(tmp_path, ckpt), 2, "over envvault's 16 MiB limit")


def test_hostile_stamp_is_ignored_with_a_note(tmp_path):
    # A stamp (safetensors __metadata__ "envvault") holding a 5,000-digit integer, then one nested 50,000
    # deep: the file reads, the stamp is ignored, a note says why.
    for name, stamp in (("int", '{"snapshot": ' + "9" * 5000 + "}"), ("deep", "[" * 50_000 + "]" * 50_000)):
        ckpt = safetensors(tmp_path / f"{name}.safetensors",
                           {"__metadata__": {"format": "pt", "envvault": stamp},
                            "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4)
        run = _inspect(tmp_path, ckpt, "--json")
        _bounded(run)
        assert run.returncode == 0, run.stderr
        doc = json.loads(run.stdout)
        assert doc["stamp"] is None
        assert any("stamp ignored" in n for n in doc["notes"]), doc["notes"]


def test_many_small_values_are_refused_before_memory_runs_out(tmp_path):
    # ( + 32 MiB of None + l. : took 5 GB and printed 335 MB.
    pkl = P2 + b"(" + b"N" * (32 << 20) + b"l."
    _refused(_inspect(tmp_path, bare_pickle(tmp_path / "nones.pkl", pkl)), 2, "opcodes")


def test_shared_references_do_not_multiply_the_output(tmp_path):
    # L0 = ["x" * 1000]; L(i+1) = [Li, Li]: 2**60 leaves by reference, printed until the budget ends.
    pkl = P2 + b"]" + unicode("x" * 1000) + b"a" + b"q\x00"
    for i in range(1, 61):
        pkl += b"](h" + bytes([i - 1]) + b"h" + bytes([i - 1]) + b"eq" + bytes([i])
    pkl += b"."
    run = _inspect(tmp_path, bare_pickle(tmp_path / "dag.pkl", pkl))
    _bounded(run)
    assert run.returncode == 0, run.stderr
    assert len(run.stdout) < 12 << 20


def test_many_blocked_calls_are_listed_once_each_up_to_a_limit(tmp_path):
    pkl = P2 + b"]" + b"cposix\nsystem\nq\x000" + b"(" + b"".join(
        b"h\x00" + unicode("true") + b"\x85R" for _ in range(50_000)) + b"e."
    run = _inspect(tmp_path, bare_pickle(tmp_path / "calls.pkl", pkl), "--json")
    _bounded(run)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert len(doc["findings"]) == 100
    assert any("49900 more findings" in n for n in doc["notes"]), doc["notes"]


def test_huge_memo_index_costs_nothing(tmp_path):
    # LONG_BINPUT 4,294,967,280: the C unpickler sized its memo by it.
    pkl = P2 + b"N" + b"r\xf0\xff\xff\xff" + b"0" + b"j\xf0\xff\xff\xff" + b"."
    run = _inspect(tmp_path, bare_pickle(tmp_path / "memo.pkl", pkl))
    _bounded(run)
    assert run.returncode == 0, run.stderr


def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = mkfifo(tmp_path / "x.pt")
    _refused(_inspect(tmp_path, fifo), 2, "not a regular file")


def test_fifo_sidecar_in_a_checkpoint_folder_does_not_block(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    mkfifo(folder / "envvault.json")
    mkfifo(folder / "config.json")
    safetensors(folder / "model.safetensors", {"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
                b"\0" * 4)
    run = _inspect(tmp_path, folder, "--json")
    _bounded(run)
    assert run.returncode == 0, run.stderr
    assert any("not a regular file" in n for n in json.loads(run.stdout)["notes"])


@pytest.mark.parametrize("command", ["diff", "restore"])
def test_diff_and_restore_read_a_hostile_checkpoint_safely(tmp_path, command):
    pkl = P2 + b"}" + b"K\x01" + b"\x85" * 300_000 + b"K\x01s."
    ckpt = torch_zip(tmp_path / "deep.pt", pkl)
    from envvault.vault.store import Vault

    Vault.open(tmp_path / "vault", create=True)  # an empty vault: the checkpoint is read before any lookup
    args = [command, str(ckpt), "latest"] if command == "diff" else [command, str(ckpt), "--dry-run"]
    run = run_limited(tmp_path / "vault", *args, cwd=tmp_path)
    _refused(run, 2, "nests tuples more than 100 deep")
    assert "deep.pt" in run.stderr


def test_hostile_stamp_in_a_pickle_is_read_within_limits(tmp_path):
    # The stamp key of a dict checkpoint holding a list 200,000 long: rendered up to the budget.
    pkl = P2 + b"}" + unicode("envvault") + b"}" + unicode("argv") + b"(" + b"N" * 200_000 + b"ls."
    run = _inspect(tmp_path, torch_zip(tmp_path / "stamp.pt", pkl))
    _bounded(run)
    assert run.returncode == 0, run.stderr
