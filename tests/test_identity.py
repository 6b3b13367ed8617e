"""The identity rules (envvault.model.identity) and the RECORD parser (envvault.model.record), row by row."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from envvault.model.identity import (
    DistLayout,
    build_id,
    is_bytecode,
    is_generated,
    is_launcher,
    is_script,
    normalise_script,
    same_build,
    script_digest,
    verbatim_rows,
)
from envvault.model.record import RecordEntry, format_record, parse_record

DEMO = DistLayout("demo-1.0.dist-info", "../../../bin", frozenset({"demo-cli"}))

PIP_LAUNCHER = (b"#!/venvs/a/bin/python3\n# -*- coding: utf-8 -*-\nimport re\nimport sys\n"
                b"from pip._internal.cli.main import main\nif __name__ == '__main__':\n"
                b"    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n    sys.exit(main())\n")
UV_LAUNCHER = (b'#!/venvs/b/bin/python\n# -*- coding: utf-8 -*-\nimport sys\nfrom pip._internal.cli.main import cli\n'
               b'if __name__ == "__main__":\n    if sys.argv[0].endswith("-script.pyw"):\n'
               b'        sys.argv[0] = sys.argv[0][:-11]\n    elif sys.argv[0].endswith(".exe"):\n'
               b'        sys.argv[0] = sys.argv[0][:-4]\n    sys.exit(cli())\n')
VIRTUALENV_LAUNCHER = (b"#!/venvs/c/bin/python\n# -*- coding: utf-8 -*-\nimport re\nimport sys\n"
                       b"if __name__ == '__main__':\n    from pip._internal.cli.main import cli\n"
                       b"    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n    sys.exit(cli())\n")
TRAMPOLINE = b"#!/bin/sh\n'''exec' '/very/long/path/bin/python' \"$0\" \"$@\"\n' '''\n"
LONG_PATH_LAUNCHER = TRAMPOLINE + PIP_LAUNCHER.split(b"\n", 1)[1]
INSTALLER_LAUNCHER = b"#!python\r\n" + PIP_LAUNCHER.split(b"\n", 1)[1].replace(b"\n", b"\r\n")
DATA_SCRIPT = b"#!/venvs/a/bin/python3\nimport dill\nprint(dill.__version__)\n"
NOT_A_LAUNCHER = (b"#!python\nimport sys\nfrom demo import main\nprint('side effect')\n"
                  b"if __name__ == '__main__':\n    sys.argv[0] = sys.argv[0].replace('-script', '')\n"
                  b"    sys.exit(main())\n")

# path, file head (None: not read, as in a lock-only scan), generated?, enters the build id?
ROWS = [
    ("demo/__init__.py", None, False, True),
    ("demo/__pycache__/__init__.cpython-311.pyc", None, True, False),
    ("demo/legacy.pyo", None, True, False),
    ("demo/__pycache__", None, True, False),  # a folder row (virtualenv's seeder)
    ("pip/_internal/exceptions/__init__.cpython-311.pyc", None, True, False),  # virtualenv: no __pycache__
    ("demo-1.0.dist-info/licenses/src/demo/__pycache__", None, True, False),
    ("demo-1.0.dist-info/METADATA", None, False, True),
    ("demo-1.0.dist-info/WHEEL", None, False, True),
    ("demo-1.0.dist-info/entry_points.txt", None, False, True),
    ("demo-1.0.dist-info/INSTALLER", None, True, False),
    ("demo-1.0.dist-info/REQUESTED", None, True, False),
    ("demo-1.0.dist-info/RECORD", None, True, False),
    ("demo-1.0.dist-info/RECORD.jws", None, True, False),
    ("demo-1.0.dist-info/RECORD.p7s", None, True, False),
    ("demo-1.0.dist-info/direct_url.json", None, True, False),
    ("demo-1.0.dist-info/uv_cache.json", None, True, False),
    ("demo/_vendor/six-1.0.dist-info/INSTALLER", None, False, True),  # a vendored copy is the wheel's
    ("demo-1.0.virtualenv", None, True, False),  # virtualenv's seeder marker
    ("demo/data.virtualenv", None, False, True),
    ("../../../bin/demo-cli", None, True, False),  # named in entry_points.txt
    ("../../../bin/pip3.12", PIP_LAUNCHER, True, False),  # not named there: pip's launcher shape
    ("../../../bin/pip3.12", UV_LAUNCHER, True, False),
    ("../../../bin/pip-3.11", VIRTUALENV_LAUNCHER, True, False),
    ("../../../bin/pip3", LONG_PATH_LAUNCHER, True, False),
    ("../../../bin/pip3", INSTALLER_LAUNCHER, True, False),
    ("../../../bin/pip3.12", None, False, False),  # unread: not known generated, never in the build id
    ("../../../bin/get_objgraph", DATA_SCRIPT, False, False),  # rewritten shebang: compared by scripts id
    ("../../../bin/demo.sh", b"#!/bin/sh\necho hi\n", False, False),
    ("../../../bin/demo-tool", NOT_A_LAUNCHER, False, False),
    ("../../../bin/big", PIP_LAUNCHER + b"#" * 5000, False, False),
    ("../../../share/demo/demo.conf", None, False, True),  # <name>.data/data/
    ("../../../include/site/python3.11/demo/demo.h", None, False, True),  # <name>.data/headers/
]


@pytest.mark.parametrize("path,head,generated,in_build", ROWS, ids=[f"{i}:{r[0]}" for i, r in enumerate(ROWS)])
def test_each_row(path, head, generated, in_build):
    row = RecordEntry(path, "sha256", "x", 1)
    assert is_generated(row, DEMO, head) is generated
    assert is_generated(path, DEMO, head) is generated
    with_row = build_id([RecordEntry("demo/a.py", "sha256", "a", 1), row], DEMO)
    without = build_id([RecordEntry("demo/a.py", "sha256", "a", 1)], DEMO)
    assert (with_row != without) is in_build


@pytest.mark.parametrize("path,bytecode", [
    ("a.pyc", True), ("a/b.pyo", True), ("a/__pycache__/b.cpython-311.pyc", True), ("a/__pycache__", True),
    ("__pycache__", True), ("a/pycache/b.py", False), ("a/b.py", False), ("a/__pycache__x/b.py", False),
])
def test_bytecode(path, bytecode):
    assert is_bytecode(path) is bytecode


@pytest.mark.parametrize("path,script", [
    ("../../../bin/x", True), ("../../../bin/sub/x", False), ("../../../share/x", False), ("bin/x", False),
    ("../../../bin/../bin/x", True),
])
def test_scripts_folder(path, script):
    assert is_script(path, DEMO) is script


def test_layout_of_absolute_paths():
    layout = DistLayout.of("d-1.dist-info", "/v/lib/python3.11/site-packages", "/v/bin", ["d"])
    assert layout == DistLayout("d-1.dist-info", "../../../bin", frozenset({"d"}))


@pytest.mark.parametrize("given,wanted", [
    (b"#!/venvs/a/bin/python3\nx\n", b"#!python\nx\n"),  # pip
    (b"#!/venvs/b/bin/python\nx\n", b"#!python\nx\n"),  # uv
    (b"#!python\nx\n", b"#!python\nx\n"),  # as in the wheel
    (b"#!/usr/bin/env python3.11\r\nx", b"#!python\nx"),
    (b"#!/opt/py/bin/pythonw\nx", b"#!python\nx"),
    (TRAMPOLINE + b"x\n", b"#!python\nx\n"),  # uv's and pip's form for long interpreter paths
    (b"#!/bin/sh\necho hi\n", b"#!/bin/sh\necho hi\n"),
    (b"\x7fELF\x02\x01", b"\x7fELF\x02\x01"),
    (b"", b""),
])
def test_normalise_script(given, wanted):
    assert normalise_script(given) == wanted


def test_rewritten_scripts_digest_alike():
    assert script_digest(DATA_SCRIPT) == script_digest(DATA_SCRIPT.replace(b"/venvs/a/bin/python3", b"/x/bin/python"))
    assert script_digest(DATA_SCRIPT) != script_digest(DATA_SCRIPT + b"# edited\n")


def test_launcher_shapes():
    for launcher in (PIP_LAUNCHER, UV_LAUNCHER, VIRTUALENV_LAUNCHER, LONG_PATH_LAUNCHER, INSTALLER_LAUNCHER):
        assert is_launcher(launcher)
    for other in (DATA_SCRIPT, NOT_A_LAUNCHER, b"#!/bin/sh\nexec x\n", PIP_LAUNCHER[2:], b"\xff" * 10, b""):
        assert not is_launcher(other)


def test_one_wheel_two_installs_one_build_id():
    """pip into one venv, uv into another: launchers, rewritten script hashes, bytecode and installer
    files differ; the build id does not. A changed package file changes it."""
    common = [RecordEntry("dill/__init__.py", "sha256", "AAA", 10),
              RecordEntry("dill-0.3.8.dist-info/METADATA", "sha256", "BBB", 20)]
    by_pip = common + [
        RecordEntry("../../../bin/get_objgraph", "sha256", "pip-rewritten", 301),
        RecordEntry("../../../bin/pip3.12", "sha256", "launcher", 250),
        RecordEntry("dill/__pycache__/__init__.cpython-312.pyc", "sha256", "pyc", 5),
        RecordEntry("dill-0.3.8.dist-info/INSTALLER", "sha256", "pip", 4),
        RecordEntry("dill-0.3.8.dist-info/RECORD", None, None, None),
    ]
    by_uv = common + [
        RecordEntry("../../../bin/get_objgraph", "sha256", "uv-rewritten", 299),
        RecordEntry("dill-0.3.8.dist-info/INSTALLER", "sha256", "uv", 3),
        RecordEntry("dill-0.3.8.dist-info/uv_cache.json", "sha256", "c", 9),
        RecordEntry("dill-0.3.8.dist-info/RECORD", None, None, None),
    ]
    layout = DistLayout("dill-0.3.8.dist-info")
    assert build_id(by_pip, layout) == build_id(by_uv, layout)
    other = [RecordEntry("dill/__init__.py", "sha256", "CCC", 10)] + by_pip[1:]
    assert build_id(other, layout) != build_id(by_pip, layout)


@pytest.mark.parametrize("a,b,same", [
    ({"build_id": "b1", "identity": 2}, {"build_id": "b1", "identity": 2}, True),
    ({"build_id": "b1", "identity": 2}, {"build_id": "b2", "identity": 2}, False),
    ({"build_id": "b1", "identity": 2, "scripts": "s1"}, {"build_id": "b1", "identity": 2, "scripts": "s2"}, False),
    ({"build_id": "b1", "identity": 2, "scripts": "s1"}, {"build_id": "b1", "identity": 2, "scripts": None}, True),
    ({"build_id": "b1"}, {"build_id": "b2", "identity": 2}, None),  # identity 1 against 2: cannot tell
    ({"build_id": "b1"}, {"build_id": "b2"}, False),
    ({"version": "1.0"}, {"build_id": "b1", "identity": 2}, None),  # a foreign pylock
])
def test_same_build(a, b, same):
    def summary(d: dict) -> SimpleNamespace:  # the fields of model.snapshot.PackageSummary that same_build reads
        return SimpleNamespace(build_id=d.get("build_id"), identity=d.get("identity"), scripts=d.get("scripts"))

    assert same_build(summary(a), summary(b)) is same


def test_verbatim_rows_of_a_wheel_and_its_installation():
    wheel = {"demo/__init__.py": "sha256=a", "demo-1.0.data/scripts/tool": "sha256=s",
             "demo-1.0.data/purelib/x.py": "sha256=p", "demo-1.0.dist-info/METADATA": "sha256=m",
             "demo-1.0.dist-info/RECORD": ""}
    installed = {"demo/__init__.py": "sha256=a", "../../../bin/tool": "sha256=t", "x.py": "sha256=p",
                 "demo/__pycache__/__init__.cpython-311.pyc": "sha256=c", "demo-1.0.dist-info/METADATA": "sha256=m",
                 "demo-1.0.dist-info/INSTALLER": "sha256=i", "demo-1.0.dist-info/RECORD": ""}
    assert verbatim_rows(wheel) == {"demo/__init__.py": "sha256=a", ".dist-info/METADATA": "sha256=m"}
    assert verbatim_rows(installed) == {"demo/__init__.py": "sha256=a", "x.py": "sha256=p",
                                        ".dist-info/METADATA": "sha256=m"}


# RECORD text, entries wanted, problems wanted ("row N: ...").
RECORDS = [
    ("a.py,sha256=abc,12\n", [RecordEntry("a.py", "sha256", "abc", 12)], []),
    ("pip/__pycache__,,\n", [RecordEntry("pip/__pycache__", None, None, None)], []),
    ("d-1.dist-info/RECORD,,\r\n\r\n", [RecordEntry("d-1.dist-info/RECORD", None, None, None)], []),
    ('"a,b.py",sha256=x,1\n', [RecordEntry("a,b.py", "sha256", "x", 1)], []),
    ("a.py,sha256=x\n", [], ["row 1: has 2 fields, not 3"]),
    ("a.py,sha256=x,1\nb.py,nohash,1\nc.py,sha256=y,big\n,sha256=z,1\n",
     [RecordEntry("a.py", "sha256", "x", 1)],
     ["row 2: 'b.py' has a bad hash 'nohash' (want algo=digest)", "row 3: 'c.py' has a bad size 'big'",
      "row 4: '' has an empty path"]),
]


@pytest.mark.parametrize("text,entries,problems", RECORDS)
def test_parse_record(text, entries, problems):
    got, found = parse_record(text)
    assert got == entries
    assert [str(p) for p in found] == problems


def test_record_round_trip():
    entries = [RecordEntry("a,b.py", "sha256", "x", 1), RecordEntry("d-1.dist-info/RECORD", None, None, None)]
    assert format_record(entries) == '"a,b.py",sha256=x,1\nd-1.dist-info/RECORD,,\n'
    assert parse_record(format_record(entries)) == (entries, [])


def test_large_records_parse_once_and_each_caller_owns_its_lists(monkeypatch):
    """A large RECORD read again (a restore reads torch's three or four times) is parsed once: the same rows,
    in lists each caller may change without touching the next caller's; the memo keeps a few texts (by a
    digest, not the text), the oldest dropped first, and never holds small ones or garbled ones (a problem a
    row of a 64 MiB file would be gigabytes kept)."""
    from envvault.model import record

    big = "".join(f"pkg/m{i}.py,sha256={'x' * 43},{i}\r\n" for i in range(3000))
    assert len(big) >= record._MEMO_MIN
    calls = []
    real = record._parse
    monkeypatch.setattr(record, "_parse", lambda text: calls.append(len(text)) or real(text))
    record._memo.clear()
    first, problems = parse_record(big)
    assert len(first) == 3000 and problems == []
    first.clear()
    problems.append("mine")
    again, problems2 = parse_record(big)
    assert again == real(big)[0] and problems2 == [] and len(calls) == 1
    assert parse_record(big.replace("\r\n", "\n"))[0] == again  # another text: parsed, same rows
    assert len(calls) == 2
    for k in range(record._MEMO_SIZE):
        parse_record(big + f"extra{k}.py,,\n")
    assert record._text_key(big) not in record._memo and len(record._memo) == record._MEMO_SIZE
    assert not any(isinstance(k, str) for k in record._memo)  # no text kept
    parse_record("a.py,sha256=x,1\n")
    assert record._text_key("a.py,sha256=x,1\n") not in record._memo
    garbled = big + "bad.py,=abc,1\r\n"
    for _ in range(2):
        rows, found = parse_record(garbled)
        assert len(rows) == 3000 and [str(p) for p in found] == [
            "row 3001: 'bad.py' has a bad hash '=abc' (want algo=digest)"]
    assert record._text_key(garbled) not in record._memo and len(calls) == 2 + record._MEMO_SIZE + 1 + 2


def test_an_algorithm_without_a_digest_is_a_row_without_a_hash():
    """pdm writes ``sha256=`` (no digest) for each file it links into its cache: a row without a hash, as
    ``,,`` is; a digest without an algorithm, an unknown algorithm without a digest, or no ``=`` stay garbled."""
    rows, problems = parse_record("pkg/a.py,sha256=,12\npkg/b.py,,3\n")
    assert problems == [] and [(r.path, r.algo, r.digest, r.size) for r in rows] == [
        ("pkg/a.py", None, None, 12), ("pkg/b.py", None, None, 3)]
    _rows, problems = parse_record("a.py,=abc,1\nb.py,crc=,1\nc.py,sha256,1\n")
    assert [p.row for p in problems] == [1, 2, 3], problems


RECORD_TEXTS = {
    "lf": "pkg/__init__.py,sha256={h},1\npkg/a.py,sha256={h},2\npkg-1.0.dist-info/RECORD,,\n",
    "crlf (pip)": "pkg/__init__.py,sha256={h},1\r\npkg/a.py,sha256={h},2\r\npkg-1.0.dist-info/RECORD,,\r\n",
    "cr only": "pkg/__init__.py,sha256={h},1\rpkg/a.py,sha256={h},2\rpkg-1.0.dist-info/RECORD,,\r",
    "a lone cr in a row": "pkg/__init__.py,sha256={h},1\npkg/a.py,sha\r256={h},2\npkg/b.py,sha256={h},3\n",
    "crlf in a quoted path": '"pkg/a\r\nb.py",sha256={h},1\r\npkg/__init__.py,sha256={h},2\r\n',
    "bom, cr cr lf": "\ufeffpkg/__init__.py,sha256={h},1\r\r\npkg/a.py,sha256={h},2\r\n",
}


@pytest.mark.parametrize("style", sorted(RECORD_TEXTS))
@pytest.mark.parametrize("large", [False, True])
def test_record_digest_is_the_id_of_the_newline_translated_rows(tmp_path, style, large):
    """The build id of a RECORD read without a scan (``env/static.py``) is what it always was, the id of the
    rows Python's text mode gives (a lone CR ends a row), whatever the newlines, small or memoized."""
    from envvault.env.static import record_digest
    from envvault.model.identity import DistLayout, build_id

    text = RECORD_TEXTS[style].format(h="x" * 43)
    if large:
        line = "\r\n" if "\r\n" in text else "\n"
        text += "".join(f"pkg/m{i}.py,sha256={'y' * 43},{i}{line}" for i in range(1000))
    d = tmp_path / "pkg-1.0.dist-info"
    d.mkdir()
    (d / "RECORD").write_bytes(text.encode("utf-8"))
    before = build_id(parse_record((d / "RECORD").read_text(encoding="utf-8"))[0], DistLayout(d.name))
    assert record_digest(d) == before
    assert record_digest(d) == before  # again, from the memo when large


def test_record_digest_shares_the_scans_parse_of_a_pip_record(tmp_path, monkeypatch):
    """pip writes RECORD with CRLF: the scan's reader and the build id's reader parse one text, once."""
    from envvault.env.dists import read_dist
    from envvault.env.static import record_digest
    from envvault.model import record

    site = tmp_path / "site"
    d = site / "pkg-1.0.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n")
    (d / "RECORD").write_bytes("".join(f"pkg/m{i}.py,sha256={'y' * 43},{i}\r\n" for i in range(2000)).encode())
    calls = []
    real = record._parse
    monkeypatch.setattr(record, "_parse", lambda text: calls.append(1) or real(text))
    record._memo.clear()
    assert len(read_dist(d, site).record) == 2000
    record_digest(d)
    assert len(calls) == 1


def _summary(name, build, identity=None, scripts=None, modified=()):
    p = {"name": name, "version": "1.0", "build_id": build, "state_id": build, "modified": list(modified),
         "missing": [], "manifest": "0" * 64, "files": 1, "size": 1}
    if identity is not None:
        p.update(identity=identity, scripts=scripts)
    return p


def test_diff_across_identity_versions():
    """An identity-1 snapshot against an identity-2 one: a package whose ids changed only because the rules
    did is no change; edits still are; within one identity version a changed scripts id is a build change."""
    from envvault.diff import diff_snapshots

    old = {"packages": [_summary("dill", "old-id"), _summary("six", "old-six")]}
    new = {"packages": [_summary("dill", "new-id", 2), _summary("six", "new-six", 2, modified=["six.py"])]}
    result = diff_snapshots(old, new).to_json()["packages"]
    assert [(c["name"], c["kind"]) for c in result["changed"]] == [("six", "edited")]
    a = {"packages": [_summary("dill", "b", 2, scripts="s1")]}
    b = {"packages": [_summary("dill", "b", 2, scripts="s2")]}
    assert [(c["name"], c["kind"]) for c in diff_snapshots(a, b).to_json()["packages"]["changed"]] == [("dill", "build")]
    c = {"packages": [_summary("dill", "b", 2, scripts=None)]}
    assert diff_snapshots(a, c).to_json()["packages"]["changed"] == []


def test_record_rows_share_one_algorithm_name():
    """A scan holds every RECORD row of the environment (69,000 on a GPU host's venv): the rows' algorithm
    names are one string, not one a row; an unknown name is kept as written."""
    from envvault.model.record import parse_record

    text = "".join(f"pkg/m{i}.py,sha256=AAAA{i},{i}\n" for i in range(3)) + "pkg/x.py,blake9=BB,1\n"
    rows, problems = parse_record(text)
    assert not problems and [r.algo for r in rows] == ["sha256"] * 3 + ["blake9"]
    assert rows[0].algo is rows[1].algo is rows[2].algo
