"""The plain command lines read without click: one reader for the quick ``status`` (``quick.py``) and the
lean commands (``lean.py``), so that the commands users run most pay neither click's import nor its parse.

``read_plain`` takes ``[--vault PATH] WORDS... [OPTION | ARGUMENT]...`` in the spellings click takes the same
way (``--opt VALUE``, ``--opt=VALUE``, a flag, a repeatable option, up to ``arguments`` plain words) and
nothing else: an unknown or repeated option, an option value or an argument that is empty or starts with
``-``, ``--``, ``-mVALUE``, a value missing. For those it returns None and the command goes to click, which
reads it (or says what is wrong) its own way. The click commands stay the one definition of the options;
tests check that this reading agrees with theirs.
"""

from __future__ import annotations

__all__ = ["read_plain", "FLAG", "VALUE", "MANY"]

FLAG, VALUE, MANY = "flag", "value", "many"
_GLOBAL = {"--vault": ("vault", VALUE)}


def read_plain(args: list[str], words: tuple[str, ...], options: dict, arguments: int = 0) -> dict | None:
    """The reading of ``args`` as the command ``words`` (``("snap",)``, ``("cache", "restore")``), or None.

    ``options`` maps each spelling to ``(name, kind)`` or, for one of a pair of flags (``--merge/--replace``),
    ``(name, FLAG, value)``; kind is ``FLAG`` (True when given), ``VALUE`` (once at most) or ``MANY`` (a list).
    The result maps ``"vault"`` (the global ``--vault`` or None), each option given, and ``"arguments"``
    (the plain words after the command, at most ``arguments`` of them)."""
    got: dict = {"vault": None, "arguments": []}
    i = 0
    while i < len(args) and args[i] != words[0]:
        i = _option(args, i, _GLOBAL, got, set())
        if i is None:
            return None
    if tuple(args[i:i + len(words)]) != words:
        return None
    i += len(words)
    given: set = set()
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-"):
            if not arg or len(got["arguments"]) >= arguments:
                return None
            got["arguments"].append(arg)
            i += 1
            continue
        i = _option(args, i, options, got, given)
        if i is None:
            return None
    return got


def _option(args: list[str], i: int, options: dict, got: dict, given: set) -> int | None:
    """Read the option at ``args[i]`` into ``got``; the next index, or None for what is not read here."""
    arg = args[i]
    # ``--opt=VALUE``; a short option takes the next word only (click reads ``-m=x`` as the value ``=x``)
    name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
    spec = options.get(name)
    if spec is None or name in given:
        return None
    given.add(name)
    dest, kind = spec[0], spec[1]
    if kind == FLAG:
        if eq or dest in got:  # ``--flag=x``; the other of a pair given too
            return None
        got[dest] = spec[2] if len(spec) > 2 else True
        return i + 1
    if not eq:
        if i + 1 >= len(args):
            return None
        value, i = args[i + 1], i + 1
    if not value or value.startswith("-"):
        return None
    if kind == MANY:
        given.discard(name)  # repeatable
        got.setdefault(dest, []).append(value)
    elif dest in got and got[dest] is not None:
        return None
    else:
        got[dest] = value
    return i + 1
