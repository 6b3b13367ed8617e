#!/usr/bin/env bash
# The in-place restore of torch on the device venv (`rm -rf torch`, then `restore --no-backup`), three ways in
# the same rounds beside its anchor: the carried old tree (.whl/old-tree: `git archive REV envvault`), the
# wheel's tree, and the wheel's tree with ENVVAULT_WRITE_PROCESSES=1 (the threads of one process: what the
# forked writers change, alone), order rotating round by round; the anchor `zstd -dc | tar -x` of torch
# (Python's zstandard: no zstd CLI there). The new tree's restore phases (ENVVAULT_STAGES=1) of each round
# follow. Usage: OUT=$OUT bash bench/gpu_inplace_ab.sh [ROUNDS]
set -u
ROUNDS=${1:-5}
NO_EXPORT=1 . bench/gpu_two_trees_setup.sh
SP=$($PY -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')
ZC="import sys, zstandard; zstandard.ZstdCompressor(level=3, threads=-1).copy_stream(sys.stdin.buffer, sys.stdout.buffer)"
ZD="import sys, zstandard; zstandard.ZstdDecompressor().copy_stream(sys.stdin.buffer, sys.stdout.buffer)"
tar -cf - -C "$SP" torch | PYTHONPATH=/tmp/site $PY -c "$ZC" >/tmp/torch.tar.zst
run() {  # run NAME: one timed restore of torch after rm -rf torch
  rm -rf "$SP/torch" && sync
  case $1 in
    anchor) t0=$(now); PYTHONPATH=/tmp/site $PY -c "$ZD" </tmp/torch.tar.zst | tar -xf - -C "$SP"; t1=$(now) ;;
    old) t0=$(now); PYTHONPATH=/tmp/oldsite $PY -m envvault restore latest --venv $V --no-backup >/dev/null 2>/tmp/err || tail -2 /tmp/err; t1=$(now) ;;
    new) t0=$(now); ENVVAULT_STAGES=1 PYTHONPATH=/tmp/site $PY -m envvault restore latest --venv $V --no-backup >/dev/null 2>/tmp/stages-$i || tail -2 /tmp/stages-$i; t1=$(now) ;;
    threads) t0=$(now); ENVVAULT_WRITE_PROCESSES=1 PYTHONPATH=/tmp/site $PY -m envvault restore latest --venv $V --no-backup >/dev/null 2>/tmp/err || tail -2 /tmp/err; t1=$(now) ;;
  esac
  echo "round $i $1: $(secs $t0 $t1) s"
}
variants=(anchor old new threads)
for i in $(seq "$ROUNDS"); do
  for k in 0 1 2 3; do run "${variants[$(( (k + i) % 4 ))]}"; done
done 2>&1 | tee "${OUT:-/tmp}/gpu_inplace_ab.txt"
for i in $(seq "$ROUNDS"); do echo "round $i new, stages:"; grep -E "restore:|forked children: materialize: (files made|objects|sha256|writes)" /tmp/stages-$i; done \
  | tee -a "${OUT:-/tmp}/gpu_inplace_ab.txt"
PYTHONPATH=/tmp/site $PY -m envvault status --venv $V --exit-code | tee -a "${OUT:-/tmp}/gpu_inplace_ab.txt"
$PY - "${OUT:-/tmp}/gpu_inplace_ab.txt" <<'PY' | tee -a "${OUT:-/tmp}/gpu_inplace_ab.txt"
import re, statistics, sys
t = {}
for line in open(sys.argv[1]):
    m = re.match(r"round \d+ (\w+): ([\d.]+) s", line)
    if m:
        t.setdefault(m[1], []).append(float(m[2]))
a = statistics.median(t["anchor"])
for k, v in t.items():
    print(f"{k:8s} median {statistics.median(v):.3f} s  ({', '.join(f'{x:.2f}' for x in v)})  / anchor {statistics.median(v) / a:.2f}x")
PY
