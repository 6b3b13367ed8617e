"""What the real-environment checks (``bench/*_real_env_check.py``) share: run envvault as a user does, one
line a check, a count of failures."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ENVVAULT = [sys.executable, "-m", "envvault"]


class Checks:
    """``run`` envvault in ``cwd`` with ``env`` (a failure stops the script unless ``check=False``); ``say``
    prints one check's line and counts it when it failed."""

    def __init__(self, env: dict[str, str], cwd: Path):
        self.env, self.cwd, self.failures = env, cwd, 0

    def run(self, *args, check: bool = True, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, float]:
        t = time.monotonic()
        proc = subprocess.run(ENVVAULT + list(map(str, args)), env=env or self.env, capture_output=True, text=True,
                              cwd=self.cwd)
        if check and proc.returncode != 0:
            raise SystemExit(f"envvault {' '.join(map(str, args))} exited {proc.returncode}: {proc.stderr[-600:]}")
        return proc, time.monotonic() - t

    def say(self, ok: bool, text: str) -> None:
        self.failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {text}", flush=True)

    def end(self) -> int:
        print(f"{self.failures} failure(s)")
        return 1 if self.failures else 0


def purelib(venv: Path) -> Path:
    """The environment's site-packages, as its own interpreter names it."""
    return Path(subprocess.run([str(venv / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
