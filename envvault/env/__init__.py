"""Reading an environment: its interpreter, its distributions, the host it runs on."""

import sys as _sys


def chosen_python() -> str | None:
    """The ``--python`` this process was given (``env.probe.chosen_python``), without importing the probe
    when none was: a Python is chosen only through the probe, so an unimported probe has none."""
    probe = _sys.modules.get("envvault.env.probe")
    return probe.chosen_python() if probe is not None else None
