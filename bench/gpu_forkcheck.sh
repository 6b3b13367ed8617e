#!/usr/bin/env bash
# After a snap of the device venv: unchanged status walls beside pip freeze, and how many children one
# status forked for its freshness checks (envvault/vault/forked.py). Needs the carried wheels in .whl/.
set -u
PY=python3
VENV=$($PY -c 'import sys; print(sys.prefix)')
rm -rf /tmp/site /tmp/dc && $PY -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site ENVVAULT_HOME=/tmp/dc/v
tar -cf - -C "$VENV" . | cat >/dev/null
/tmp/site/bin/envvault snap --venv "$VENV" --no-caches -m base | tail -1
for i in 1 2 3 4 5; do t0=$(date +%s.%N); /tmp/site/bin/envvault status --venv "$VENV" --exit-code >/dev/null; rc=$?; t1=$(date +%s.%N); echo "status $i: $($PY -c "print(round($t1-$t0,3))") s rc $rc"; done
for i in 1 2 3; do t0=$(date +%s.%N); $PY -m pip freeze >/dev/null; t1=$(date +%s.%N); echo "pip freeze $i: $($PY -c "print(round($t1-$t0,3))") s"; done
cd /tmp && $PY -c "
import os, sys
real = os.fork; n = [0]
def spy():
    n[0] += 1; return real()
os.fork = spy
sys.argv = ['envvault', 'status', '--venv', '$VENV']
import atexit
atexit.register(lambda: print('forks', n[0], 'tasks', len(os.listdir('/proc/self/task')), file=sys.stderr))
from envvault.entry import main
main()
"
