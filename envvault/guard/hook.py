"""Shell code that routes mutating pip and uv pip commands through ``envvault guard``.

``eval "$(envvault shell-hook bash)"`` (or zsh; ``envvault shell-hook fish | source``) defines functions
``pip``, ``pip3``, ``python``, ``python3`` and ``uv``. Each one runs the real command (``command ...``)
unless all of these hold, in which case it runs ``envvault guard -- <the same words>``:

- a virtual environment is active (``$VIRTUAL_ENV`` is set), or ``$ENVVAULT_PYTHON`` names a system
  interpreter (a container's Python: guard then runs with ``--python $ENVVAULT_PYTHON``; an active venv wins);
- ``$ENVVAULT_DISABLE`` is empty or ``0``;
- it is not already inside a guarded command (``$ENVVAULT_GUARD_ACTIVE``);
- the words are ``pip``/``pip3``/``pip3.N ...``, ``python``/``python3``/``python3.N -m pip ...`` (or
  ``-mpip``) or ``uv ... pip ...``, and one of them is ``install``, ``uninstall`` or ``sync``. guard parses
  the command exactly and runs anything that does not change the environment (``pip install --dry-run``,
  ``pip install --target``) untouched.

A ``sudo`` function routes ``sudo [-E|-H|-n|-S|-k ...] pip ...`` and ``sudo ... python3 -m pip ...`` the same
way, only while ``$ENVVAULT_PYTHON`` is set (sudo's own PATH reaches the system Python, never an active venv):
``guard --python $ENVVAULT_PYTHON -- sudo ...``, guard running as the user (the vault stays theirs) and
only the command under sudo. Every other ``sudo`` command runs as typed (``command sudo``), its words only
compared with fixed patterns.

The functions call the interpreter envvault was installed with, so the hook works in any venv, including
ones without envvault. If that interpreter disappears, the hook warns and runs the command unguarded. They
run envvault through :func:`envvault.env.untrusted.boot_code`, never ``python -m envvault``: ``-m`` (and ``-c``) put the current
folder first on ``sys.path``, so an ``envvault/`` folder (or a ``typing.py``) in the checkout the user
stands in would run instead.
"""

from __future__ import annotations

import shlex
import sys

from envvault.env.untrusted import boot_code

__all__ = ["SHELLS", "hook_code"]

SHELLS = ("bash", "zsh", "fish")
# python3.N / pip3.N commands the hook wraps besides python, python3, pip, pip3.
_MINORS = range(6, 21)

_POSIX = r"""# envvault shell hook ({shell}): eval "$(envvault shell-hook {shell})"
# Routes pip, pip3, python -m pip and uv pip installs, uninstalls and syncs through `envvault guard`
# while a virtual environment is active (or $ENVVAULT_PYTHON names a system Python). ENVVAULT_DISABLE=1 turns it off.
__envvault_python={python}
__envvault_boot={boot}

__envvault_wanted() {{
    [ -n "${{VIRTUAL_ENV:-}}" ] || [ -n "${{ENVVAULT_PYTHON:-}}" ] || return 1
    case "${{ENVVAULT_DISABLE:-}}" in ""|0) ;; *) return 1 ;; esac
    [ -z "${{ENVVAULT_GUARD_ACTIVE:-}}" ] || return 1
    local __envvault_word
    for __envvault_word in "$@"; do
        case "$__envvault_word" in install|uninstall|sync) return 0 ;; esac
    done
    return 1
}}

__envvault_run() {{
    if __envvault_wanted "$@"; then
        if [ -x "$__envvault_python" ]; then
            if [ -z "${{VIRTUAL_ENV:-}}" ]; then  # a system Python (docs/cli.md, shell-hook)
                "$__envvault_python" -c "$__envvault_boot" guard --python "$ENVVAULT_PYTHON" -- "$@"
            else
                "$__envvault_python" -c "$__envvault_boot" guard -- "$@"
            fi
            return
        fi
        echo "envvault: $__envvault_python is gone; running $1 unguarded (ENVVAULT_DISABLE=1 silences this)" >&2
    fi
    command "$@"
}}

__envvault_py() {{
    local __envvault_name="$1"
    shift
    if [ "${{1:-}}" = "-mpip" ] || {{ [ "${{1:-}}" = "-m" ] && [ "${{2:-}}" = "pip" ]; }}; then
        __envvault_run "$__envvault_name" "$@"
    else
        command "$__envvault_name" "$@"
    fi
}}

__envvault_sudo_pip() {{
    [ -n "${{ENVVAULT_PYTHON:-}}" ] || return 1
    local __envvault_state=opts __envvault_word
    for __envvault_word in "$@"; do
        case "$__envvault_state:$__envvault_word" in
            opts:-E|opts:-H|opts:-n|opts:-S|opts:-k|opts:--preserve-env|opts:--set-home|opts:--non-interactive|opts:--stdin) ;;
            opts:pip|opts:pip3|opts:pip3.[0-9]*|opts:*/pip|opts:*/pip3|opts:*/pip3.[0-9]*) __envvault_state=pip ;;
            opts:python|opts:python3|opts:python3.[0-9]*|opts:*/python|opts:*/python3|opts:*/python3.[0-9]*) __envvault_state=py ;;
            py:-m) __envvault_state=pym ;;
            py:-mpip|pym:pip) __envvault_state=pip ;;
            pip:*) break ;;
            *) return 1 ;;
        esac
    done
    [ "$__envvault_state" = pip ] && __envvault_wanted "$@" && [ -x "$__envvault_python" ]
}}

function sudo {{
    if __envvault_sudo_pip "$@"; then
        "$__envvault_python" -c "$__envvault_boot" guard --python "$ENVVAULT_PYTHON" -- sudo "$@"
        return
    fi
    command sudo "$@"
}}

{pip_functions}
{python_functions}
function uv {{
    local __envvault_word
    for __envvault_word in "$@"; do
        if [ "$__envvault_word" = "pip" ]; then __envvault_run uv "$@"; return; fi
    done
    command uv "$@"
}}
"""

_FISH = r"""# envvault shell hook (fish): envvault shell-hook fish | source
# Routes pip, pip3, python -m pip and uv pip installs, uninstalls and syncs through `envvault guard`
# while a virtual environment is active (or $ENVVAULT_PYTHON names a system Python). ENVVAULT_DISABLE=1 turns it off.
set -g __envvault_python {python}
set -g __envvault_boot {boot}

function __envvault_wanted
    test -n "$VIRTUAL_ENV"; or test -n "$ENVVAULT_PYTHON"; or return 1
    if set -q ENVVAULT_DISABLE; and test -n "$ENVVAULT_DISABLE"; and test "$ENVVAULT_DISABLE" != 0
        return 1
    end
    if set -q ENVVAULT_GUARD_ACTIVE; and test -n "$ENVVAULT_GUARD_ACTIVE"
        return 1
    end
    for word in $argv
        switch $word
            case install uninstall sync
                return 0
        end
    end
    return 1
end

function __envvault_run
    if __envvault_wanted $argv
        if test -x "$__envvault_python"
            if test -z "$VIRTUAL_ENV"
                $__envvault_python -c $__envvault_boot guard --python $ENVVAULT_PYTHON -- $argv
            else
                $__envvault_python -c $__envvault_boot guard -- $argv
            end
            return $status
        end
        echo "envvault: $__envvault_python is gone; running $argv[1] unguarded (ENVVAULT_DISABLE=1 silences this)" >&2
    end
    command $argv
end

function __envvault_py
    set -l name $argv[1]
    set -e argv[1]
    if test (count $argv) -ge 1; and test "$argv[1]" = -mpip
        __envvault_run $name $argv
    else if test (count $argv) -ge 2; and test "$argv[1]" = -m; and test "$argv[2]" = pip
        __envvault_run $name $argv
    else
        command $name $argv
    end
end

function __envvault_sudo_pip
    test -n "$ENVVAULT_PYTHON"; or return 1
    set -l state opts
    for word in $argv
        switch "$state:$word"
            case 'opts:-E' 'opts:-H' 'opts:-n' 'opts:-S' 'opts:-k' 'opts:--preserve-env' 'opts:--set-home' 'opts:--non-interactive' 'opts:--stdin'
                continue
            case 'opts:pip' 'opts:pip3' 'opts:pip3.?*' 'opts:*/pip' 'opts:*/pip3' 'opts:*/pip3.?*'
                set state pip
            case 'opts:python' 'opts:python3' 'opts:python3.?*' 'opts:*/python' 'opts:*/python3' 'opts:*/python3.?*'
                set state py
            case 'py:-m'
                set state pym
            case 'py:-mpip' 'pym:pip'
                set state pip
            case 'pip:*'
                break
            case '*'
                return 1
        end
    end
    test "$state" = pip; and __envvault_wanted $argv; and test -x "$__envvault_python"
end

function sudo --wraps sudo
    if __envvault_sudo_pip $argv
        $__envvault_python -c $__envvault_boot guard --python $ENVVAULT_PYTHON -- sudo $argv
        return $status
    end
    command sudo $argv
end

{pip_functions}
{python_functions}
function uv --wraps uv
    if contains -- pip $argv
        __envvault_run uv $argv
    else
        command uv $argv
    end
end
"""


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _wrappers(shell: str) -> tuple[str, str]:
    pips = ["pip", "pip3"] + [f"pip3.{n}" for n in _MINORS]
    pythons = ["python", "python3"] + [f"python3.{n}" for n in _MINORS]
    if shell == "fish":
        pip = "\n".join(f"function {n} --wraps {n}\n    __envvault_run {n} $argv\nend" for n in pips)
        py = "\n".join(f"function {n} --wraps {n}\n    __envvault_py {n} $argv\nend" for n in pythons)
    else:
        pip = "\n".join(f'function {n} {{ __envvault_run {n} "$@"; }}' for n in pips)
        py = "\n".join(f'function {n} {{ __envvault_py {n} "$@"; }}' for n in pythons)
    return pip, py


def hook_code(shell: str, python: str | None = None) -> str:
    """The hook for ``shell`` ("bash", "zsh" or "fish"), calling envvault through ``python``
    (default: the interpreter running this envvault)."""
    python = python or sys.executable
    if shell not in SHELLS:
        raise ValueError(f"unknown shell {shell!r}; choose one of {', '.join(SHELLS)}")
    pip, py = _wrappers(shell)
    if shell == "fish":
        return _FISH.format(python=_fish_quote(python), boot=_fish_quote(boot_code()), pip_functions=pip,
                            python_functions=py)
    return _POSIX.format(shell=shell, python=shlex.quote(python), boot=shlex.quote(boot_code()), pip_functions=pip,
                         python_functions=py)
