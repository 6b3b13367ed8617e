#!/usr/bin/env bash
# First snaps of the device's venv with the pack writer's in-flight bounds changed (bench/tuned_snap.py),
# settings alternately, beside tar | zstd: whether the compressors' idle time (py-spy, bench/gpu_gil.sh) comes
# from the bounds, and what memory a wider window costs. Usage: OUT=$OUT bash bench/gpu_tuning.sh [ROUNDS] [SETTINGS...]
# (a setting: "BYTES_MIB:FRAMES_A_WORKER", optionally "/MMAP_KIB"; "" the defaults, "/1024" only the threshold)
set -u
OUT=${OUT:-/tmp}
ROUNDS=${1:-2}; shift || true
SETTINGS=("$@"); [ ${#SETTINGS[@]} -eq 0 ] && SETTINGS=("" "64:2" "128:2" "64:4")
PY=python3
VENV=$($PY -c 'import sys; print(sys.prefix)')
rm -rf /tmp/site /tmp/tun && mkdir -p /tmp/tun
$PY -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
$PY -m compileall -q -j 0 /tmp/site >/dev/null
export PYTHONPATH=/tmp/site
ZC='import sys, zstandard; zstandard.ZstdCompressor(level=3, threads=-1).copy_stream(sys.stdin.buffer, sys.stdout.buffer)'
tar -cf - -C "$VENV" . | cat >/dev/null
now() { date +%s.%N; }
secs() { $PY -c "print(round($2 - $1, 3))"; }
for i in $(seq "$ROUNDS"); do
  t0=$(now); tar -cf - -C "$VENV" . | $PY -c "$ZC" >/tmp/tun/venv.tar.zst; t1=$(now); echo "anchor tar|zstd round $i: $(secs $t0 $t1) s"
  for s in "${SETTINGS[@]}"; do
    rm -rf /tmp/tun/v && sync
    t0=$(now); TUNE=${s%%/*} MMAP_KIB=$( [[ $s == */* ]] && echo "${s#*/}" ) ENVVAULT_HOME=/tmp/tun/v $PY bench/tuned_snap.py snap --venv "$VENV" --no-caches -m t >/dev/null 2>/tmp/tun/err; t1=$(now)
    echo "first snap tune='${s:-default}' round $i: $(secs $t0 $t1) s, $(grep 'peak RSS' /tmp/tun/err)"
  done
done 2>&1 | tee "$OUT/gpu_tuning.txt"
