"""envvault shell-hook in real interactive shells on a pseudo-terminal: the disaster typed by hand.

bash, zsh and fish are all tested; a missing shell fails the test (``.ci/run`` installs zsh and fish).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures import IndexServer
from fixtures import catalogue as C
from fixtures.guard_helpers import PtyShell, guard_env, run_envvault, venv_with_pip, wreck_wheel
from envvault.guard.hook import hook_code

PROMPT = "PTYSHELL$ "


def _protect_torchlike(venv: Path) -> None:
    (venv / ".envvault.toml").write_text('[guard]\nprotect = ["torchlike"]\n')


@pytest.fixture
def scene(tmp_path, wheelhouse):
    """A pip venv with the CUDA build, an index serving the other build, and a shell environment in which
    the venv is not yet active."""
    venv = venv_with_pip(tmp_path / "venv", "torchlike==2.11.0+cu128", find_links=[wheelhouse[C.TORCH_CU128].parent])
    _protect_torchlike(venv)
    wreck = wreck_wheel(tmp_path / "wreck")
    with IndexServer([wheelhouse[C.SERVING], wheelhouse[C.TORCH_PLAIN_B], wreck]) as srv:
        env = guard_env(venv, tmp_path / "vault", index_url=srv.url, uv_cache=tmp_path / "uvcache")
        env.pop("VIRTUAL_ENV")
        env["PATH"] = env["PATH"].split(":", 1)[1]  # the venv's bin/ comes with `activate`
        env["HOME"] = str(tmp_path)
        yield venv, env


def _torch(sh: PtyShell) -> str:
    out, rc = sh.run("torchlike-info")
    assert rc == 0, out
    return out.strip().splitlines()[-1]


def _before_id(text: str) -> str:
    return re.search(r"envvault: snapshot ([0-9a-f]{12}) of ", text).group(1)


def test_hook_code_is_valid_shell():
    for shell, check in (("bash", ["bash", "-n"]), ("zsh", ["zsh", "-n"]), ("fish", ["fish", "--no-execute"])):
        code = hook_code(shell, python="/opt/env vault/bin/python")
        assert "'/opt/env vault/bin/python'" in code
        assert shutil.which(check[0]), f"{shell} is not installed (.ci/run installs it: apt-get install -y zsh fish)"
        proc = subprocess.run([*check, "-c" if shell != "fish" else "-c", code], capture_output=True, text=True)
        assert proc.returncode == 0, (shell, proc.stderr)
    with pytest.raises(ValueError):
        hook_code("tcsh")
    printed = run_envvault("shell-hook", "bash", env={"PATH": "/usr/bin:/bin"})
    assert printed.returncode == 0 and printed.stdout == hook_code("bash", python=sys.executable)


def test_disaster_typed_in_interactive_bash(scene):
    venv, env = scene
    with PtyShell(["/bin/bash", "--norc", "--noprofile", "-i"], env, cwd=venv.parent, prompt=PROMPT) as sh:
        sh.expect(re.escape(PROMPT))
        out, rc = sh.run(f'eval "$({sys.executable} -m envvault shell-hook bash)"')
        assert rc == 0, out
        # Without an active venv nothing is routed.
        out, rc = sh.run("pip install --help >/dev/null")
        assert rc == 0 and "envvault:" not in out
        out, rc = sh.run(f"source {venv}/bin/activate")
        assert rc == 0, out
        out, rc = sh.run("type pip")
        assert "pip is a function" in out
        out, rc = sh.run("pip --version")
        assert rc == 0 and "envvault:" not in out and str(venv) in out
        assert _torch(sh) == "torchlike 2.11.0+cu128 cuda 12.8"

        # 1. stdin is not a terminal: the swap is shown and refused (exit 3).
        out, rc = sh.run("pip install --force-reinstall servingpkg </dev/null")
        assert rc == 3, out
        assert "SWAP      torchlike 2.11.0+cu128 -> 2.11.0  another build of the same release" in out
        assert "rerun with --yes" in out
        assert _torch(sh) == "torchlike 2.11.0+cu128 cuda 12.8"

        # 2. Typed at the terminal: guard asks, the user says yes; the diff names the swap.
        start = len(sh.output)
        sh.send("pip install --force-reinstall servingpkg; echo __RC__=$?\n")
        sh.expect(r"torchlike would change\. Go ahead\? \[y/N\]")
        sh.send("y\n")
        sh.expect(r"Keep this change\? \[Y/n\]")
        sh.send("y\n")
        rc = int(sh.expect(r"__RC__=(\d+)").group(1))
        out = sh.output[start:]
        assert rc == 0, out
        assert "version   torchlike 2.11.0+cu128 -> 2.11.0 (local label): cuda 12.8 -> 13.0" in out
        before = _before_id(out)
        assert f"undo with: envvault restore {before}" in out
        assert _torch(sh) == "torchlike 2.11.0+cu130 cuda 13.0"

        # 3. envvault restore brings the CUDA build back.
        out, rc = sh.run(f"envvault restore {before}")
        assert rc == 0, out
        assert _torch(sh) == "torchlike 2.11.0+cu128 cuda 12.8"

        # 4. A failing install is rolled back on its own; pip's exit code comes through.
        start = len(sh.output)
        sh.send("pip install --force-reinstall wreckpkg; echo __RC__=$?\n")
        sh.expect(r"Go ahead\? \[y/N\]")
        sh.send("y\n")
        rc = int(sh.expect(r"__RC__=(\d+)").group(1))
        out = sh.output[start:]
        assert rc == 1, out
        assert "restored snapshot" in out and "exited 1" in out
        assert _torch(sh) == "torchlike 2.11.0+cu128 cuda 12.8"
        out, rc = sh.run("pip list 2>/dev/null | grep -c wreckpkg")
        assert out.strip().splitlines()[-1] == "0"

        # 5. The user says no after seeing what happened: rolled back too.
        start = len(sh.output)
        sh.send("python -m pip install --force-reinstall servingpkg; echo __RC__=$?\n")
        sh.expect(r"Go ahead\? \[y/N\]")
        sh.send("y\n")
        sh.expect(r"Keep this change\? \[Y/n\]")
        sh.send("n\n")
        rc = int(sh.expect(r"__RC__=(\d+)").group(1))
        assert rc == 0 and "restored snapshot" in sh.output[start:]
        assert _torch(sh) == "torchlike 2.11.0+cu128 cuda 12.8"

        # 6. uv pip goes through guard as well; no at the first question: nothing runs.
        start = len(sh.output)
        sh.send("uv pip uninstall torchlike; echo __RC__=$?\n")
        sh.expect(r"Go ahead\? \[y/N\]")
        sh.send("n\n")
        rc = int(sh.expect(r"__RC__=(\d+)").group(1))
        assert rc == 3 and "remove    torchlike 2.11.0+cu128" in sh.output[start:]
        assert _torch(sh) == "torchlike 2.11.0+cu128 cuda 12.8"

        # 7. Everything else is left alone; ENVVAULT_DISABLE=1 turns the hook off.
        out, rc = sh.run("python -c 'print(6 * 7)'")
        assert rc == 0 and "42" in out and "envvault:" not in out
        out, rc = sh.run("uv --version")
        assert rc == 0 and "envvault:" not in out
        out, rc = sh.run("ENVVAULT_DISABLE=1 pip install servingpkg")
        assert rc == 0 and "envvault:" not in out and "Successfully installed servingpkg-1.0.0" in out
        out, rc = sh.run("deactivate; pip install --help >/dev/null")
        assert rc == 0 and "envvault:" not in out


def _other_shell(scene, argv: list[str], activate: str, status: str):
    venv, env = scene
    with PtyShell(argv, env, cwd=venv.parent, prompt=PROMPT) as sh:
        sh.send(f"{activate} {venv}/bin/activate{'.fish' if 'fish' in argv[0] else ''}\n")
        hook = f"{sys.executable} -m envvault shell-hook {Path(argv[0]).name}"
        sh.send((f"{hook} | source\n" if "fish" in argv[0] else f'eval "$({hook})"\n'))

        def run(line: str) -> tuple[str, int]:
            sh._count += 1
            tag = f"__RC{sh._count}__"
            start = len(sh.output)
            sh.send(f"{line}; echo {tag}={status}\n")
            m = sh.expect(re.escape(tag) + r"=(\d+)", 300)
            return sh.output[start:m.start()], int(m.group(1))

        out, rc = run("pip --version")
        assert rc == 0 and "envvault:" not in out and str(venv) in out
        out, rc = run("pip install --force-reinstall servingpkg </dev/null")
        assert rc == 3 and "SWAP      torchlike 2.11.0+cu128 -> 2.11.0" in out, out
        out, rc = run("python -m pip install --force-reinstall servingpkg </dev/null")
        assert rc == 3, out
        out, rc = run("pip install --dry-run --force-reinstall servingpkg")
        assert rc == 0 and "Would install" in out and "SWAP" not in out


def test_hook_in_interactive_zsh(scene):
    assert shutil.which("zsh"), "zsh is not installed (.ci/run installs it: apt-get install -y zsh)"
    _other_shell(scene, [shutil.which("zsh"), "-f", "-i"], "source", "$?")


def test_hook_in_interactive_fish(scene):
    assert shutil.which("fish"), "fish is not installed (.ci/run installs it: apt-get install -y fish)"
    _other_shell(scene, [shutil.which("fish"), "--no-config", "-i"], "source", "$status")


def test_hook_catches_mpip_and_versioned_python_in_interactive_bash(scene):
    """`python -mpip` (no space) and `python3.N -m pip` went around the hook (issue 14, item 9)."""
    venv, env = scene
    versioned = sorted(p.name for p in (venv / "bin").glob("python3.*") if p.name[len("python3."):].isdigit())
    assert versioned, list((venv / "bin").iterdir())
    with PtyShell(["/bin/bash", "--norc", "--noprofile", "-i"], env, cwd=venv.parent, prompt=PROMPT) as sh:
        sh.expect(re.escape(PROMPT))
        out, rc = sh.run(f'eval "$({sys.executable} -m envvault shell-hook bash)"')
        assert rc == 0, out
        out, rc = sh.run(f"source {venv}/bin/activate")
        assert rc == 0, out
        for line in ("python -mpip install --force-reinstall servingpkg </dev/null",
                     f"{versioned[0]} -m pip install --force-reinstall servingpkg </dev/null",
                     f"{versioned[0]} -mpip install --force-reinstall servingpkg </dev/null"):
            out, rc = sh.run(line)
            assert rc == 3, (line, out)
            assert "SWAP      torchlike 2.11.0+cu128 -> 2.11.0" in out, (line, out)
        assert _torch(sh) == "torchlike 2.11.0+cu128 cuda 12.8"
        out, rc = sh.run(f"{versioned[0]} -c 'print(6 * 7)'")
        assert rc == 0 and "42" in out and "envvault:" not in out
