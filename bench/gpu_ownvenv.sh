#!/usr/bin/env bash
# Where `status` spends its time when envvault runs from a venv of its own (uv tool style) against the
# device's venv, beside the same build run with the venv's interpreter (PYTHONPATH): walls, -X importtime,
# cProfile. Needs the carried wheels installed in /tmp/site (gpu_env_run.sh or gpu_stages) and .whl/.
set -u
OUT=${OUT:-/tmp}
PY=python3
VENV=$($PY -c 'import sys; print(sys.prefix)')
BASE=$($PY -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))')
rm -rf /tmp/tool /tmp/ownv
$BASE -m venv --without-pip /tmp/tool
/tmp/site/bin/uv pip install -q --offline --no-index --no-deps --compile-bytecode --python /tmp/tool/bin/python .whl/*.whl
export ENVVAULT_HOME=/tmp/ownv
PYTHONPATH=/tmp/site /tmp/site/bin/envvault snap --venv "$VENV" --no-caches -m own >/dev/null
for i in 1 2 3; do
  for how in venv own; do
    t0=$(date +%s.%N)
    if [ $how = venv ]; then PYTHONPATH=/tmp/site /tmp/site/bin/envvault status --venv "$VENV" >/dev/null
    else /tmp/tool/bin/envvault status --venv "$VENV" >/dev/null; fi
    t1=$(date +%s.%N)
    echo "status ($how) $i: $($PY -c "print(round($t1 - $t0, 3))") s"
  done
done
/tmp/tool/bin/python -X importtime -m envvault status --venv "$VENV" 2>"$OUT/importtime_status_own.txt" >/dev/null
PYTHONPATH=/tmp/site $PY -X importtime -m envvault status --venv "$VENV" 2>"$OUT/importtime_status_venv.txt" >/dev/null
/tmp/tool/bin/python -m cProfile -s cumulative -m envvault status --venv "$VENV" 2>&1 | head -60 >"$OUT/profile_status_own.txt"
PYTHONPATH=/tmp/site $PY -m cProfile -s cumulative -m envvault status --venv "$VENV" 2>&1 | head -60 >"$OUT/profile_status_venv.txt"
t0=$(date +%s.%N); /tmp/tool/bin/python -c pass; t1=$(date +%s.%N); echo "own python -c pass: $($PY -c "print(round($t1 - $t0, 3))") s"
t0=$(date +%s.%N); $PY -c pass; t1=$(date +%s.%N); echo "venv python -c pass: $($PY -c "print(round($t1 - $t0, 3))") s"
ls /tmp/tool/lib/python3*/site-packages/envvault/__pycache__ | head -3; ls /usr/lib/python3.12/__pycache__ 2>/dev/null | wc -l; python3 -c "import dataclasses, os; print(dataclasses.__cached__, os.path.exists(dataclasses.__cached__))"
