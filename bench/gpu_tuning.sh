#!/usr/bin/env bash
# First snaps of the device's venv with the pack writer's in-flight bounds changed (bench/tuned_snap.py),
# settings alternately, beside tar | zstd: whether the compressors' idle time (py-spy, bench/gpu_gil.sh) comes
# from the bounds, and what memory a wider window costs. Usage: OUT=$OUT bash bench/gpu_tuning.sh [ROUNDS] [SETTINGS...]
# (a setting: "BYTES_MIB:FRAMES_A_WORKER", optionally "/MMAP_KIB"; "" the defaults, "/1024" only the threshold)
set -u
OUT=${OUT:-/tmp}
ROUNDS=${1:-2}; shift || true
SETTINGS=("$@"); [ ${#SETTINGS[@]} -eq 0 ] && SETTINGS=("" "64:2" "128:2" "64:4")
source bench/gpu_site.sh
rm -rf /tmp/tun && mkdir -p /tmp/tun
for i in $(seq "$ROUNDS"); do
  t0=$(now); tar -cf - -C "$VENV" . | $PY -c "$ZC" >/tmp/tun/venv.tar.zst; t1=$(now); echo "anchor tar|zstd round $i: $(secs $t0 $t1) s"
  for s in "${SETTINGS[@]}"; do
    rm -rf /tmp/tun/v && sync
    t0=$(now); TUNE=${s%%/*} MMAP_KIB=$( [[ $s == */* ]] && echo "${s#*/}" ) ENVVAULT_HOME=/tmp/tun/v $PY bench/tuned_snap.py snap --venv "$VENV" --no-caches -m t >/dev/null 2>/tmp/tun/err; t1=$(now)
    echo "first snap tune='${s:-default}' round $i: $(secs $t0 $t1) s, $(grep 'peak RSS' /tmp/tun/err)"
  done
done 2>&1 | tee "$OUT/gpu_tuning.txt"
