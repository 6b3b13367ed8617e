#!/usr/bin/env bash
# Where a first snap's threads hold the GIL on the device: py-spy (carried at bench/out/pyspy/py-spy) samples
# the snap with --gil (only the thread holding the GIL is recorded) and once without (every thread, idle ones
# too), then bench/gil_summary.py sums the samples by thread and innermost envvault function. A plain first snap
# and the tar | zstd anchor are timed beside them.
set -u
OUT=${OUT:-/tmp}
source bench/gpu_site.sh
SPY=$PWD/bench/out/pyspy/py-spy
chmod +x "$SPY"
rm -rf /tmp/gil && mkdir -p /tmp/gil
{
for i in 1 2; do
  t0=$(now); tar -cf - -C "$VENV" . | $PY -c "$ZC" >/tmp/gil/venv.tar.zst; t1=$(now); echo "anchor tar|zstd $i: $(secs $t0 $t1) s"
  rm -rf /tmp/gil/v && sync
  t0=$(now); ENVVAULT_HOME=/tmp/gil/v $PY -m envvault snap --venv "$VENV" --no-caches -m plain >/dev/null; t1=$(now); echo "first snap $i: $(secs $t0 $t1) s"
done
rm -rf /tmp/gil/v && sync
t0=$(now); ENVVAULT_HOME=/tmp/gil/v "$SPY" record --gil --threads --format raw -r 200 -o /tmp/gil/gil.txt -- $PY -m envvault snap --venv "$VENV" --no-caches -m gil >/dev/null 2>/tmp/gil/spy.err; t1=$(now)
echo "first snap under py-spy --gil: $(secs $t0 $t1) s"; tail -2 /tmp/gil/spy.err
rm -rf /tmp/gil/v && sync
t0=$(now); ENVVAULT_HOME=/tmp/gil/v "$SPY" record --idle --threads --format raw -r 100 -o /tmp/gil/all.txt -- $PY -m envvault snap --venv "$VENV" --no-caches -m all >/dev/null 2>/tmp/gil/spy2.err; t1=$(now)
echo "first snap under py-spy --idle: $(secs $t0 $t1) s"; tail -2 /tmp/gil/spy2.err
} >"$OUT/gil_times.txt" 2>&1
{ echo "===== GIL held (py-spy --gil)"; $PY bench/gil_summary.py /tmp/gil/gil.txt
  echo "===== every thread, idle too (py-spy --idle)"; $PY bench/gil_summary.py /tmp/gil/all.txt; } >"$OUT/gil_summary.txt" 2>&1
cat "$OUT/gil_times.txt"
gzip -c /tmp/gil/gil.txt >"$OUT/gil.txt.gz"; gzip -c /tmp/gil/all.txt >"$OUT/all.txt.gz"
