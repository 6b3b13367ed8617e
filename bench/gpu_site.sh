# Sourced by the device scripts that time first snaps (bench/gpu_gil.sh, bench/gpu_tuning.sh): the carried
# wheels installed at /tmp/site with their bytecode, the measured venv (the device's python3) read once into the
# page cache, the tar | zstd anchor's compressor and the clock helpers.
PY=python3
VENV=$($PY -c 'import sys; print(sys.prefix)')
rm -rf /tmp/site
$PY -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
$PY -m compileall -q -j 0 /tmp/site >/dev/null
export PYTHONPATH=/tmp/site
ZC='import sys, zstandard; zstandard.ZstdCompressor(level=3, threads=-1).copy_stream(sys.stdin.buffer, sys.stdout.buffer)'
tar -cf - -C "$VENV" . | cat >/dev/null
now() { date +%s.%N; }
secs() { $PY -c "print(round($2 - $1, 3))"; }
