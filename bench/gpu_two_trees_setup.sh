# Sourced by the device scripts that run two envvault trees in the same rounds (gpu_restore_trees_ab.sh,
# gpu_into_variants.sh): the carried wheels in /tmp/site, the old tree (.whl/old-tree: `git archive REV envvault`)
# in /tmp/oldsite, both compiled; the page cache warmed; the device venv snapped into /tmp/abv and exported to
# /tmp/exp (uv's install of those wheels is the --into anchor). Sets PY, V, now, secs, empty_tree, BASE, UVB.
# -P (PYTHONSAFEPATH): `python -m envvault` run from the repository root would otherwise import the working
# tree's envvault ahead of PYTHONPATH, whatever tree a variant names. Until 2026-12-06 (the twenty-fifth
# session) it did: every "old" variant of these scripts ran the carried working tree, not .whl/old-tree.
PY="python3 -P"
V=$($PY -c 'import sys;print(sys.prefix)')
rm -rf /tmp/site /tmp/oldsite && $PY -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1
cp -r /tmp/site /tmp/oldsite && rm -rf /tmp/oldsite/envvault && cp -r .whl/old-tree/envvault /tmp/oldsite/
$PY -m compileall -q -j 0 /tmp/site /tmp/oldsite >/dev/null
now() { date +%s.%N; }
# A finished tree's files emptied (blocks freed, inodes kept; one linked elsewhere left whole), so that no
# timed run follows freed inodes on the device's journal-less ext4 (bench/gpu_into_fair.sh says why).
empty_tree() { find "$1" -type f -links 1 -print0 | xargs -0 -r truncate -s 0; sync; }
secs() { $PY -c "print(round($2 - $1, 3))"; }
tar -cf - $V 2>/dev/null | cat >/dev/null
export ENVVAULT_HOME=/tmp/abv
rm -rf /tmp/abv && PYTHONPATH=/tmp/site $PY -m envvault snap --venv $V --no-caches | tail -1
# NO_EXPORT=1: no --into anchor wanted (gpu_inplace_ab.sh): the export's 30 s go to the rounds.
[ -n "${NO_EXPORT:-}" ] || { rm -rf /tmp/exp && PYTHONPATH=/tmp/site $PY -m envvault export latest -o /tmp/exp/pylock.toml >/dev/null; }
BASE=$($PY -c 'import os, sys; print(os.path.realpath(sys._base_executable))')
UVB=/tmp/site/bin/uv
