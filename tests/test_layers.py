"""The layers of docs/architecture.md hold: imports point down and no package has an import cycle among its
modules, late imports included. Two checkers: import-linter with the contracts in pyproject.toml
(`[tool.importlinter]`: a layers contract and an acyclic-siblings contract), and the project's shared tool
`../shared/tools/import_cycles.py` (module-level cycles), which CI has beside the clone."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT.parent / "shared" / "tools" / "import_cycles.py"


def test_import_linter_contracts_are_kept():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "import-linter is missing: it is in the `test` extra"
    proc = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"import-linter contracts broken:\n{proc.stdout}\n{proc.stderr}"
    assert "2 kept, 0 broken" in proc.stdout, proc.stdout


def test_no_import_cycles():
    assert TOOL.exists(), f"{TOOL} is missing: CI runs with ../shared beside the clone"
    proc = subprocess.run([sys.executable, str(TOOL), "envvault"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"import cycles:\n{proc.stdout}"
