#!/usr/bin/env bash
# First snaps of the device's venv with the pack writer's in-flight bounds changed (bench/tuned_snap.py),
# settings alternately, beside tar | zstd: whether the compressors' idle time (py-spy, bench/gpu_gil.sh) comes
# from the bounds, and what memory a wider window costs. Usage: OUT=$OUT bash bench/gpu_tuning.sh [ROUNDS] [SETTINGS...]
# (a setting: bench/tuned_snap.py's variables, space-separated, e.g. "TUNE=64:4 MMAP_KIB=1024" or "ARENA_MAX=4";
# "" the defaults). Each snap's vault size, the digest of its packs' names and its memory (the process's own peak
# RSS, its largest child's, and the whole process tree's peak PSS: bench/tree_memory.py) are printed beside its time.
set -u
OUT=${OUT:-/tmp}
ROUNDS=${1:-2}; shift || true
SETTINGS=("$@"); [ ${#SETTINGS[@]} -eq 0 ] && SETTINGS=("" "TUNE=64:2" "TUNE=128:2" "TUNE=64:4")
source bench/gpu_site.sh
# "PYTHONPATH=/tmp/oldsite" as a setting: the carried old tree (.whl/old-tree, `git archive REV envvault`) with
# the same wheels, to compare two commits in the same rounds
if [ -d .whl/old-tree/envvault ]; then
  rm -rf /tmp/oldsite && cp -r /tmp/site /tmp/oldsite && rm -rf /tmp/oldsite/envvault
  cp -r .whl/old-tree/envvault /tmp/oldsite/ && $PY -m compileall -q -j 0 /tmp/oldsite/envvault >/dev/null
fi
rm -rf /tmp/tun && mkdir -p /tmp/tun
for i in $(seq "$ROUNDS"); do
  t0=$(now); tar -cf - -C "$VENV" . | $PY -c "$ZC" >/tmp/tun/venv.tar.zst; t1=$(now); echo "anchor tar|zstd round $i: $(secs $t0 $t1) s"
  for s in "${SETTINGS[@]}"; do
    rm -rf /tmp/tun/v && sync
    t0=$(now); env $s ENVVAULT_HOME=/tmp/tun/v $PY bench/tree_memory.py $PY bench/tuned_snap.py snap --venv "$VENV" --no-caches -m t >/dev/null 2>/tmp/tun/err; t1=$(now)
    echo "first snap tune='${s:-default}' round $i: $(secs $t0 $t1) s, $(grep 'peak RSS' /tmp/tun/err | tr '\n' ' ')$(grep 'tree peak' /tmp/tun/err), vault $(du -sb /tmp/tun/v | cut -f1) B, packs $(find /tmp/tun/v/packs -name "*.pack" -printf "%f\n" | sort | md5sum | cut -c1-12)"
    grep -E 'Error|error:' /tmp/tun/err | head -3
  done
done 2>&1 | tee "$OUT/gpu_tuning.txt"
