"""The suite's own disk use: with this project's pytest settings a passing test's ``tmp_path`` is removed as the
test ends and a failing one's is kept for reading. CI once ran out of disk near the end of the suite when every
test's venvs and vaults stayed until the session ended."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_TWO = '''
def test_passes(tmp_path):
    (tmp_path / "big").write_bytes(b"x" * 1000)

def test_fails(tmp_path):
    (tmp_path / "kept").write_bytes(b"y")
    assert False
'''


def test_a_passing_tests_tmp_path_is_removed_and_a_failing_ones_kept(tmp_path):
    (tmp_path / "inner").mkdir()
    (tmp_path / "inner" / "test_two.py").write_text(_TWO)
    base = tmp_path / "base"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path / "inner"),
                           "--basetemp", str(base), str(tmp_path / "inner" / "test_two.py")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "1 failed, 1 passed" in proc.stdout, proc.stdout + proc.stderr
    left = sorted(p.name for p in base.iterdir() if not p.is_symlink())  # pytest adds "...current" links
    assert left == ["test_fails0"], left
    assert (base / "test_fails0" / "kept").read_bytes() == b"y"
