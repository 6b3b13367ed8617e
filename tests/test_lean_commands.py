"""The lean commands (issue 11; envvault/lean.py, envvault/argv.py, envvault/commands/plain.py): a plain
``snap`` or ``cache restore`` runs without importing click, reads its command line as click reads it, and
answers exactly as the click command does, errors included (envvault/failures.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures import catalogue as C
from fixtures import uv_install
from tests.evtools import assert_one_line_error, ev, ev_env


def _run(vault: Path, *args: str, lean: bool = True, **extra: str) -> tuple[subprocess.CompletedProcess, set]:
    """``python -X importtime -m envvault *args``; the process and the modules it imported."""
    env = ev_env(vault, **extra, **({} if lean else {"ENVVAULT_LEAN": "0"}))
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "envvault", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=300)
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
    proc.stderr = "\n".join(ln for ln in proc.stderr.splitlines() if not ln.startswith("import time:"))
    assert "envvault.entry" in imported  # the measurement sees the command's imports
    return proc, imported


def _same(vault: Path, *args: str, lean_run: bool = True, between=None) -> tuple[subprocess.CompletedProcess,
                                                                                   subprocess.CompletedProcess]:
    """The command run with the lean path allowed and through click, one after the other: the same exit code,
    stdout and stderr (snapshot ids, sizes and times masked: each run makes its own snapshot); the first
    imported no click (``lean_run``), or went to click itself. ``between()`` runs between the two."""
    lean, lean_mods = _run(vault, *args)
    if between is not None:
        between()
    full, full_mods = _run(vault, *args, lean=False)
    assert ("click" not in lean_mods and "envvault.cli" not in lean_mods) == lean_run, args
    assert "click" in full_mods

    def masked(text: str) -> str:  # what differs from run to run: ids, sizes, times
        for pattern, word in ((r"\d{4}-\d\d-\d\dT[\d:.]+Z?", "TIME"), (r"\b[0-9a-f]{12,64}\b", "ID"),
                              (r"\d+(\.\d+)? (B|KiB|MiB|GiB)", "SIZE"), (r'"(seconds|new_bytes|new_objects)": [\d.]+', "N"),
                              (r"\d+\.\d+s\b", "S")):
            text = re.sub(pattern, word, text)
        return text

    assert lean.returncode == full.returncode, (lean, full)
    assert masked(lean.stdout) == masked(full.stdout)
    assert masked(lean.stderr) == masked(full.stderr)
    assert "Traceback" not in lean.stderr
    return lean, full


@pytest.fixture
def venv(make_venv, wheelhouse):
    venv = make_venv("uv")
    uv_install(venv, str(wheelhouse[C.SMALL_01]))
    return venv


def test_a_plain_snap_runs_without_click_and_answers_as_click(tmp_path, venv):
    vault = tmp_path / "v"
    ev(vault, "snap", "--venv", venv, "--no-caches")
    lean, _ = _same(vault, "snap", "--venv", venv, "-m", "again")
    assert lean.returncode == 0 and "snapshot " in lean.stdout
    _same(vault, "--vault", vault, "snap", f"--venv={venv}", "--message=again", "--no-caches")
    _same(vault, "snap", "--venv", venv, "--lock-only")
    lean, full = _same(vault, "snap", "--venv", venv, "--json", "--cache-dir", tmp_path / "nocache")
    assert json.loads(lean.stdout).keys() == json.loads(full.stdout).keys()
    # what each recorded (newest first): the message, the lock-only flag, the same both ways
    listed = json.loads(ev(vault, "list", "--all", "--json").stdout)["snapshots"]
    assert [(s["message"], s["lock_only"]) for s in listed] == \
        [("", False)] * 2 + [("", True)] * 2 + [("again", False)] * 4 + [("", False)]


@pytest.mark.parametrize("args,lean_run", [
    (["snap", "--venv", "/nonexistent/venv"], True),  # the environment's error, from find_target
    (["snap", "--venv", "/etc/hostname"], False),  # a file: click's own usage error (exit 2)
    (["snap", "--venv"], False),  # a value missing: click's error
    (["snap", "--bogus"], False),
    (["cache", "restore", "--to", "/etc/hostname"], False),
    (["cache", "restore", "nosuchsnapshot"], True),
])
def test_errors_are_the_ones_click_gives(tmp_path, venv, args, lean_run):
    vault = tmp_path / "v"
    ev(vault, "snap", "--venv", venv, "--no-caches")
    lean, _ = _same(vault, *args, lean_run=lean_run)
    assert lean.returncode != 0 and lean.stderr.strip()


def test_a_vault_path_that_is_a_file_goes_to_click(tmp_path, venv):
    afile = tmp_path / "file"
    afile.write_text("x")
    proc, imported = _run(tmp_path / "v", "snap", "--venv", venv, ENVVAULT_HOME=str(afile))
    assert proc.returncode == 2 and "is a file" in proc.stderr and "click" in imported


def test_a_plain_cache_restore_runs_without_click_and_answers_as_click(tmp_path, venv):
    vault = tmp_path / "v"
    cache = tmp_path / "cache"
    (cache / "sub").mkdir(parents=True)
    for i in range(5):
        (cache / "sub" / f"f{i}.py").write_text(f"x = {i}\n" * 100)
    ev(vault, "cache", "snap", "--cache-dir", cache, "--no-discover", "--venv", venv)
    for args in (["cache", "restore", "--to", tmp_path / "a", "--venv", venv],
                 ["cache", "restore", "latest", "--to", tmp_path / "b", "--dry-run"],
                 ["cache", "restore", "--to", tmp_path / "c", "--replace", "--kind", "user", "--json"]):
        written = []

        def keep_and_clear(to=args[args.index("--to") + 1]):
            written.append(sorted(p.name for p in to.rglob("*.py")))
            shutil.rmtree(to, ignore_errors=True)

        lean, full = _same(vault, *args, between=keep_and_clear)
        assert lean.returncode == 0, lean
        assert written == [[] if "--dry-run" in args else [f"f{i}.py" for i in range(5)]]
    # no snapshot with caches: the same one-line error both ways
    empty = tmp_path / "empty"
    ev(empty, "snap", "--venv", venv, "--no-caches")
    lean, _ = _same(empty, "cache", "restore", "--to", tmp_path / "d")
    assert_one_line_error(lean, "no snapshot with compile caches")


_SNAP_READINGS = [
    (["snap"], {}),
    (["snap", "--venv", "/v", "-m", "hi there", "--lock-only"], {"venv": "/v", "message": "hi there", "lock_only": True}),
    (["--vault=/x", "snap", "--message=m", "--no-caches", "--json"],
     {"vault": "/x", "message": "m", "no_caches": True, "as_json": True}),
    (["snap", "--cache-dir", "/a", "--cache-dir=/b"], {"cache_dirs": ["/a", "/b"]}),
    (["snap", "-m=x"], None),  # click reads "=x": not taken here
    (["snap", "-mx"], None),
    (["snap", "-m", ""], None),
    (["snap", "-m", "-x"], None),
    (["snap", "--venv", "/a", "--venv", "/b"], None),
    (["snap", "--lock-only", "--lock-only"], None),
    (["snap", "--python", "/usr/bin/python3"], None),
    (["snap", "--help"], None),
    (["snap", "extra"], None),
    (["snap", "--"], None),
    (["snap", "--json=1"], None),
    (["--vault", "/x"], None),
    (["status"], None),
]


@pytest.mark.parametrize("argv,want", _SNAP_READINGS)
def test_the_lean_reading_of_snap_is_clicks(argv, want):
    """What the lean reader takes, click reads into the same values (the click command stays the one
    definition of the options; this checks the lean reading agrees)."""
    from envvault.lean import _SNAP, read_plain

    got = read_plain(argv, ("snap",), _SNAP)
    assert (got is None) == (want is None), got
    if want is None:
        return
    from envvault.cli import cli
    from envvault.commands.snapshots import snap

    at = argv.index("snap")
    group = cli.make_context("envvault", argv[:at] + ["snap"], resilient_parsing=True)
    params = snap.make_context("snap", argv[at + 1:]).params
    assert group.params["vault_path"] == got["vault"] == want.get("vault")
    lean = {"venv": got.get("venv"), "message": got.get("message", ""), "lock_only": got.get("lock_only", False),
            "no_caches": got.get("no_caches", False), "cache_dirs": tuple(got.get("cache_dirs", ())),
            "as_json": got.get("as_json", False)}
    assert lean == {k: params[k] for k in lean}
    assert all(lean[k] == (tuple(v) if isinstance(v, list) else v) for k, v in want.items() if k != "vault")


@pytest.mark.parametrize("argv,want", [
    (["cache", "restore"], {}),
    (["cache", "restore", "abc", "--to", "/t", "--replace", "--kind", "inductor", "--kind=triton"],
     {"id": "abc", "to": "/t", "merge": False, "kinds": ["inductor", "triton"]}),
    (["cache", "restore", "--merge", "--root", "/r", "--archived-roots", "--dry-run", "--json", "latest"],
     {"id": "latest", "merge": True, "roots": ["/r"], "archived_roots": True, "dry_run": True, "as_json": True}),
    (["cache", "restore", "a", "b"], None),
    (["cache", "restore", "--merge", "--replace"], None),
    (["cache", "restore", "--to"], None),
    (["cache", "snap"], None),
    (["cache"], None),
])
def test_the_lean_reading_of_cache_restore_is_clicks(argv, want):
    from envvault.lean import _CACHE_RESTORE, read_plain

    got = read_plain(argv, ("cache", "restore"), _CACHE_RESTORE, 1)
    assert (got is None) == (want is None), got
    if want is None:
        return
    from envvault.commands.caches import cache_restore

    params = cache_restore.make_context("restore", argv[2:]).params
    lean = {"snapshot_id": (got["arguments"] or ["latest"])[0], "to": got.get("to"), "merge": got.get("merge", True),
            "kinds": tuple(got.get("kinds", ())), "roots": tuple(got.get("roots", ())),
            "archived_roots": got.get("archived_roots", False), "dry_run": got.get("dry_run", False),
            "as_json": got.get("as_json", False), "venv": got.get("venv")}
    assert lean == {k: params[k] for k in lean}
    assert lean["snapshot_id"] == want.get("id", "latest")


def test_guarded_turns_every_failure_into_one_line_and_a_code(capsys, monkeypatch):
    from envvault.errors import NotFoundError
    from envvault.failures import guarded

    def raising(err):
        def call():
            raise err
        return call

    monkeypatch.delenv("ENVVAULT_DEBUG", raising=False)
    cases = [
        (NotFoundError("no such snapshot x"), NotFoundError("x").exit_code, "envvault: error: no such snapshot x"),
        (KeyboardInterrupt(), 130, "\nenvvault: aborted"),  # as click's main says it
        (EOFError(), 130, "\nenvvault: aborted"),
        (BrokenPipeError(), 1, ""),
        (PermissionError(13, "Permission denied", "/v/x"), 6, "envvault: error:"),
        (RuntimeError("boom"), 70, "envvault: internal error: RuntimeError: boom"),
    ]
    for err, code, line in cases:
        assert guarded(raising(err)) == code, err
        out, errtext = capsys.readouterr()
        assert out == "" and errtext.startswith(line) and errtext.count("\n") == line.count("\n") + bool(line), errtext
    assert guarded(lambda: None) == 0
    assert guarded(raising(ValueError("v")), lambda err: 9 if isinstance(err, ValueError) else None) == 9
    assert guarded(raising(KeyError("k")), lambda err: None) == 70
    capsys.readouterr()
    with pytest.raises(SystemExit):
        guarded(lambda: sys.exit(3))
    monkeypatch.setenv("ENVVAULT_DEBUG", "1")
    with pytest.raises(RuntimeError):
        guarded(raising(RuntimeError("shown")))


def test_echo_prints_as_click_echo_does(monkeypatch):
    """``output.echo`` (the command bodies' printing, lean or through click): every escape sequence click
    strips is stripped off a terminal (``\\x1b[?25l`` too), and an ASCII stream (a misconfigured one) gets
    UTF-8, as click.echo wrote it, not an internal error; another encoding that cannot hold the text fails as
    it did with click."""
    import io

    import click

    from envvault.output import echo

    def stream(encoding):
        return io.TextIOWrapper(io.BytesIO(), encoding=encoding, write_through=True)

    for encoding, text in (("utf-8", "a \x1b[33mb\x1b[0m \x1b[?25lc\x1b[?25h"), ("ascii", "r\u00e9sum\u00e9 \x1b[1mx\x1b[0m")):
        ours, theirs = stream(encoding), stream(encoding)
        monkeypatch.setattr("sys.stdout", ours)
        echo(text)
        monkeypatch.setattr("sys.stdout", theirs)
        click.echo(text)  # to the standard stream, which click takes as misconfigured when it says ASCII
        assert ours.buffer.getvalue() == theirs.buffer.getvalue(), (ours.buffer.getvalue(), theirs.buffer.getvalue())
        assert b"\x1b" not in ours.buffer.getvalue()
    latin = stream("latin-1")
    monkeypatch.setattr("sys.stdout", latin)
    with pytest.raises(UnicodeEncodeError):
        echo("\u2603")
