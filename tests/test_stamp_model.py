"""The stamp record and its parser (envvault/model/stamp.py): the docs/format.md sample round-trips, every
problem of a hostile stamp is named with its place, and the stamp index keeps what parses."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from envvault.errors import CorruptError
from envvault.model.stamp import parse_stamp
from envvault.model.stamp_index import (
    INDEX_VERSION,
    IndexedSnapshot,
    IndexedState,
    StampIndex,
    parse_index_entry,
    parse_stamp_index,
)

ROOT = Path(__file__).resolve().parents[1]


def _format_sample() -> dict:
    """The stamp sample of docs/format.md, its shortened ids ("5d0c...") filled out to 64 hex digits."""
    text = (ROOT / "docs" / "format.md").read_text()
    text = text[text.index("## Checkpoint stamps"):]
    start = text.index("```json") + len("```json")
    sample = text[start: text.index("```", start)]
    return json.loads(re.sub(r'"([0-9a-f]{2,8})\.\.\."', lambda m: '"' + (m.group(1) * 64)[:64] + '"', sample))


def test_the_format_sample_round_trips():
    doc = _format_sample()
    stamp = parse_stamp(doc)
    assert stamp.to_dict() == doc
    assert stamp.snapshot == doc["snapshot"] and stamp.snapshot_lock_only is True
    assert stamp.git is not None and stamp.git.branch == "main" and stamp.argv == ("train.py", "--steps", "1000")
    assert dict(stamp.env) == {"CUDA_VISIBLE_DEVICES": "0"} and stamp.drift is None


def test_unknown_keys_are_kept_and_absent_ones_stay_absent():
    doc = {"format": 1, "snapshot": "ab" * 32, "from_the_future": {"x": [1, 2]}}
    stamp = parse_stamp(doc)
    assert stamp.to_dict() == doc
    assert stamp.venv is None and stamp.warnings == () and dict(stamp.extra) == {"from_the_future": {"x": [1, 2]}}
    copy = stamp.to_dict()
    copy["from_the_future"]["x"].append(3)  # a fresh object: the record is not changed through it
    assert stamp.to_dict() == doc


def test_every_problem_is_named_with_its_place():
    doc = {**_format_sample(), "format": 2, "snapshot": "8f3a1c2d", "venv": "relative/venv", "argv": [None] * 3,
           "git": {"root": "/p", "commit": "not-hex", "dirty": "yes"}, "env": {"A": 1},
           "drift": {"fingerprint": "cd" * 32, "changed": [{"name": "torch", "old": 1, "new": None, "other_build": False}]},
           "host": "evil\x1b]0;title\x07", "snapshot_lock_only": "no"}
    with pytest.raises(CorruptError) as err:
        parse_stamp(doc, "rec")
    message = str(err.value)
    assert message.startswith("rec: ")
    for place in ("format: 2 is newer", "snapshot: expected a 64-hex id", "venv: expected an absolute path",
                  "argv[0]:", "git.commit:", "git.dirty:", "env['A']:", "drift.changed[0].old:",
                  "host: contains a control character", "snapshot_lock_only:"):
        assert place in message, (place, message)
    assert "more" not in message  # ten problems: all listed


@pytest.mark.parametrize("value", [None, [], "text", 3])
def test_not_an_object_is_refused(value):
    with pytest.raises(CorruptError, match="expected a JSON object"):
        parse_stamp(value)


def test_sizes_are_bounded():
    with pytest.raises(CorruptError, match="argv: 20000 entries"):
        parse_stamp({"format": 1, "argv": ["x"] * 20_000})
    with pytest.raises(CorruptError, match="tool: 5000 characters"):
        parse_stamp({"format": 1, "tool": "x" * 5000})
    with pytest.raises(CorruptError, match="format: expected a positive integer"):
        parse_stamp({"format": True})


def test_index_entries_parse_or_are_left_out():
    good = IndexedSnapshot("ab" * 32, True, "2026-11-30T10:00:00.000000Z", "/v", "ab" * 32, 0, "stamp")
    state = IndexedState("cd" * 32, (("torch", "2.13.0", "ef" * 32),))
    index = StampIndex("0.1.0", {"12" * 32: good}, {"k": state})
    doc = index.to_dict()
    assert doc["version"] == INDEX_VERSION and doc["snapshots"]["12" * 32] == good.to_json()
    assert parse_stamp_index(json.loads(json.dumps(doc)), "0.1.0") == index
    doc["snapshots"]["34" * 32] = ["ab" * 32, "yes", "", "/v", None, 0, ""]  # a bad entry
    doc["snapshots"]["not-an-id"] = good.to_json()
    doc["states"]["j"] = ["cd" * 32, [["torch", "2.13.0"]]]
    parsed = parse_stamp_index(doc, "0.1.0")
    assert dict(parsed.snapshots) == {"12" * 32: good} and dict(parsed.states) == {"k": state}
    assert parse_stamp_index(doc, "0.2.0").snapshots == {}  # another envvault's index reads as empty
    with pytest.raises(CorruptError, match=r"e\[1\]: expected true or false"):
        parse_index_entry(["ab" * 32, "yes", "", "/v", None, 0, ""], "e")


def _safetensors_with_stamp(path: Path, stamp: str) -> Path:
    header = json.dumps({"__metadata__": {"format": "pt", "envvault": stamp},
                         "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    return path


def test_readers_ignore_a_malformed_stamp_and_restore_names_why(tmp_path):
    from envvault.errors import UsageError
    from envvault.torch.directories import read_checkpoint
    from envvault.torch.resolve import snapshot_of
    from envvault.vault.store import Vault

    bad = {**_format_sample(), "snapshot": "8f3a1c2d", "venv": "../../elsewhere"}
    ckpt = _safetensors_with_stamp(tmp_path / "w.safetensors", json.dumps(bad))
    info = read_checkpoint(ckpt)
    assert info.stamp is None and info.stamp_source is None and info.to_dict()["stamp"] is None
    assert "snapshot: expected a 64-hex id" in info.stamp_problem and "venv: expected an absolute path" in info.stamp_problem
    assert any(n.endswith("stamp ignored") for n in info.notes), info.notes
    with pytest.raises(UsageError, match="snapshot: expected a 64-hex id"):
        snapshot_of(Vault.open(tmp_path / "vault", create=True), ckpt)

    good = _safetensors_with_stamp(tmp_path / "g.safetensors", json.dumps(_format_sample()))
    assert read_checkpoint(good).stamp == parse_stamp(_format_sample())


def test_inspect_escapes_control_characters_a_stamp_may_carry():
    from envvault.commands.torch import _stamp_lines

    stamp = parse_stamp({**_format_sample(), "argv": ["train.py", "\x1b]0;owned\x07"], "cwd": "/runs/a\nb"})
    lines = dict(_stamp_lines(stamp))
    assert "\x1b" not in lines["argv"] and "\\x1b" in lines["argv"] and "\n" not in lines["cwd"]
