"""No import cycles between envvault's modules, late imports included (the checker is the project's shared
tool, `../shared/tools/import_cycles.py`, which CI has beside the clone)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT.parent / "shared" / "tools" / "import_cycles.py"


def test_no_import_cycles():
    assert TOOL.exists(), f"{TOOL} is missing: CI runs with ../shared beside the clone"
    proc = subprocess.run([sys.executable, str(TOOL), "envvault"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"import cycles:\n{proc.stdout}"
