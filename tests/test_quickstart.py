"""The README's quick start, run as written on a stock Debian `python3` (PEP 668: its system site refuses
`pip install`), with the home folder and the venv path pointed into the test's tmp."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from fixtures.venvs import isolated_env
from fixtures.machine import DEBIAN_PYTHON as DEBIAN_PYTHON_PATH

ROOT = Path(__file__).resolve().parent.parent
DEBIAN_PYTHON = str(DEBIAN_PYTHON_PATH)


def _quick_start_line() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1]
    first_block = re.search(r"```\n(.*?)\n```", section, re.S)
    assert first_block, "no code block in the quick start"
    return first_block.group(1).strip()


def test_quick_start_on_debian_python(tmp_path):
    assert Path(DEBIAN_PYTHON).exists(), "the quick-start test needs Debian's /usr/bin/python3"
    managed = list(Path("/usr/lib").glob("python3*/EXTERNALLY-MANAGED"))
    assert managed, "this Python is expected to be PEP 668 externally managed"
    target = tmp_path / "target"
    subprocess.run([DEBIAN_PYTHON, "-m", "venv", str(target)], check=True)
    line = _quick_start_line()
    assert line.startswith("python3 "), line
    cmd = ("set -e; " + line.replace("python3 ", f"{DEBIAN_PYTHON} ", 1)
           .replace("/path/to/venv", str(target)))
    env = isolated_env({"HOME": str(tmp_path / "home"), "ENVVAULT_HOME": str(tmp_path / "vault"),
                        "XDG_DATA_HOME": str(tmp_path / "data")})
    env.pop("PIP_CONFIG_FILE")  # the machine's own pip configuration, as a user has it
    (tmp_path / "home").mkdir()
    proc = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"snapshot [0-9a-f]{12} of .*target", proc.stdout), proc.stdout
    assert (tmp_path / "home" / ".envvault-tool" / "bin" / "envvault").exists()
