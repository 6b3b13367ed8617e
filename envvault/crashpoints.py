"""Named crash points: where the crash-safety tests kill a real envvault process.

``ENVVAULT_TEST_CRASH_AT=<name>[:<n>][:TERM]`` makes the process SIGKILL itself at the n-th (default 1st)
passage of ``crash_point(<name>)`` (counted per process, across threads); with ``:TERM`` it sends itself
SIGTERM instead (a job scheduler's cancel: the command cleans up as after Ctrl-C, ``errors.Terminated``); with
``:STOP`` it stops itself (SIGSTOP) there once, for a test to act while it is part way (``os.waitpid`` with
``WUNTRACED`` tells when), then SIGCONT it. Several points, separated by commas, are each armed (a stop at
one, then a kill at a later one); each must name a different point (the first spec of a name is used). The variable is read once, when this module
is imported (the tests set it in a process's environment before it starts); unset, a point costs one test of
a module global (an ``os.environ`` lookup each staged file was 0.3 s of a 69,000-file ``--into`` under
cProfile). The tests drive every kill through these points, never through a sleep, so each kill lands
mid-work on every run, however fast or slow the machine.

The points, in the order a run passes them:

restore in place (``envvault/restore/inplace.py``, ``apply.py``; ``envvault/materialize.py``)
    ``journal``      journal written, nothing staged yet
    ``stage``        after each file is staged under its temp name, none renamed yet (the materializer's:
                     cache restores pass it too)
    ``staged``       every file staged, none renamed into place
    ``commit``       after each rename into place, each removal, each dist-info folder removed
    ``remove_dir``   a dist-info folder renamed away, not yet deleted
    ``committed``    the tree is the snapshot's, not yet verified; the journal is still there
    ``verified``     verified and the journal removed

writing objects (``envvault/vault/packs.py``; snap, gc's rewrites, cache snaps)
    ``pack_frame``   after each compressed frame is appended to the temp pack
    ``pack_renamed`` a pack renamed to its final name, its index not yet written
    ``pack_indexed`` a pack and its index durable

snap (``envvault/snap.py``)
    ``snap_objects`` every object of the snapshot durable, the snapshot file not yet written

gc (``envvault/vault/gc.py``)
    ``gc_caches_dropped``  stat caches gone, no snapshot deleted yet
    ``gc_snapshot_removed`` after each snapshot file is deleted
    ``gc_rewritten``       a pack's live objects copied to new packs, the old index and pack still there
    ``gc_index_removed``   a pack's index deleted, the pack itself not yet

checkpoint stamps (``envvault/torch/stamp_io.py``: a stamp added to a checkpoint file, a sidecar)
    ``stamp_write``        the file's new bytes written and fsynced under a temp name beside it, not renamed
"""

from __future__ import annotations

import os
import threading

__all__ = ["armed", "crash_point", "ENV"]

ENV = "ENVVAULT_TEST_CRASH_AT"

_lock = threading.Lock()
_counts: dict[str, int] = {}


_SPEC = os.environ.get(ENV)


def armed() -> bool:
    """A crash point is set for this process: its work stays in it (``forked.can_fork`` is False: a point passed
    in a forked child would kill only the child, which its parent replaces, or stop it while the parent waits)."""
    return bool(_SPEC)


def crash_point(name: str) -> None:
    """SIGKILL this process here when ``ENVVAULT_TEST_CRASH_AT`` names this point (see the module doc)."""
    if not _SPEC:
        return
    spec = next((one for one in _SPEC.split(",") if one.partition(":")[0] == name), None)
    if spec is None:
        return
    nth, _, how = spec.partition(":")[2].partition(":")
    with _lock:
        _counts[name] = _counts.get(name, 0) + 1
        hit = _counts[name] == int(nth or 1) or (how not in ("TERM", "STOP") and _counts[name] > int(nth or 1))
    if hit:
        import signal

        os.kill(os.getpid(), {"TERM": signal.SIGTERM, "STOP": signal.SIGSTOP}.get(how, signal.SIGKILL))
