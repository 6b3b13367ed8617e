"""Second read of the lean commands (envvault/lean.py): command lines and environments where the lean path
answers differently from the click path (``ENVVAULT_LEAN=0``). Each test failed on the code as read, before its fix (failures.py, output.echo, the completion variable)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.evtools import ev_env


def _venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return venv


def _both(vault: Path, args: list[str], **popen_env) -> dict:
    """Run ``args`` with the lean path allowed and through click; {mode: CompletedProcess}."""
    out = {}
    for mode in ("lean", "click"):
        env = ev_env(vault, **popen_env, **({"ENVVAULT_LEAN": "0"} if mode == "click" else {}))
        out[mode] = subprocess.run([sys.executable, "-m", "envvault", *args], capture_output=True, text=True,
                                   env=env, timeout=300)
    return out


def _into_closed_pipe(vault: Path, args: list[str], stream: str) -> dict:
    """Run ``args`` both ways with stdout (or stderr) a pipe whose reader is gone; {mode: (code, other stream)}."""
    got = {}
    for mode in ("lean", "click"):
        env = ev_env(vault, **({"ENVVAULT_LEAN": "0"} if mode == "click" else {}))
        r, w = os.pipe()
        os.close(r)
        try:
            kw = {"stdout": w, "stderr": subprocess.PIPE} if stream == "stdout" else {"stderr": w,
                                                                                     "stdout": subprocess.PIPE}
            proc = subprocess.run([sys.executable, "-m", "envvault", *args], env=env, timeout=300, **kw)
        finally:
            os.close(w)
        got[mode] = proc.returncode
    return got


def test_a_closed_stdout_pipe_exits_as_click_does(tmp_path):
    """``envvault snap ... | head -c0``: click's main turns an EPIPE into exit 1 (core.py, ``except OSError``:
    PacifyFlushWrapper then ``sys.exit(1)``), as the CLI always did; the lean path's ``guarded`` turns the
    BrokenPipeError into 0 (failures.py ``except BrokenPipeError: return 0``)."""
    venv = _venv(tmp_path)
    vault = tmp_path / "v"
    got = _into_closed_pipe(vault, ["snap", "--venv", str(venv), "--lock-only"], "stdout")
    assert got["click"] == 1
    assert got["lean"] == got["click"], got


def test_an_error_into_a_closed_stderr_pipe_exits_as_click_does(tmp_path):
    """``envvault cache restore nosuch 2>&1 | head -c0``: through click the error line's BrokenPipeError escapes
    ``guarded``'s handler and cli.main (exit 1); the lean path's escapes into entry.main's ``except
    BrokenPipeError: sys.exit(0)``, which wraps only the lean and quick calls (exit 0)."""
    vault = tmp_path / "v"
    vault.mkdir()
    got = _into_closed_pipe(vault, ["cache", "restore", "nosuch"], "stderr")
    assert got["lean"] == got["click"], got


@pytest.mark.parametrize("raised", [KeyboardInterrupt, EOFError])
def test_ctrl_c_during_a_lean_snap_says_what_click_says(tmp_path, monkeypatch, capsys, raised):
    """Ctrl-C (or an EOFError) inside the command: click's main turns it into a blank line and Abort ->
    "envvault: aborted" (cli._click_failure), exit 130, as before this change; the lean path's ``guarded``
    prints "envvault: interrupted" (KeyboardInterrupt) or an internal error, exit 70 (EOFError)."""
    import envvault.env.probe as probe
    from envvault import cli, lean

    def interrupted(venv):
        raise raised()

    monkeypatch.setattr(probe, "find_target", interrupted)
    monkeypatch.delenv("ENVVAULT_LEAN", raising=False)
    monkeypatch.delenv("ENVVAULT_DEBUG", raising=False)
    monkeypatch.setenv("ENVVAULT_HOME", str(tmp_path / "v"))
    (tmp_path / "venv").mkdir()
    argv = ["snap", "--venv", str(tmp_path / "venv"), "--lock-only"]

    lean_code = lean.answer(argv)
    lean_out = capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    click_out = capsys.readouterr()
    assert lean_code is not None  # the lean path ran it
    assert (done.value.code, click_out.err) == (130, "\nenvvault: aborted\n")
    assert (lean_code, lean_out.out, lean_out.err) == (done.value.code, click_out.out, click_out.err)


def test_clicks_completion_variable_is_honoured(tmp_path):
    """``_ENVVAULT_COMPLETE=bash_source envvault snap ...``: click's main answers the completion request
    (``_main_shell_completion``, before parsing) and snaps nothing; the lean path ignores the variable and
    takes a snapshot."""
    venv = _venv(tmp_path)
    vault = tmp_path / "v"
    got = _both(vault, ["snap", "--venv", str(venv), "--lock-only"], _ENVVAULT_COMPLETE="bash_source")
    assert "_envvault_completion" in got["click"].stdout
    assert got["lean"].stdout == got["click"].stdout, got["lean"].stdout
    assert not (vault / "snapshots").exists() or not any((vault / "snapshots").iterdir())
