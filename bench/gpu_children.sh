#!/usr/bin/env bash
# First full snaps of the device's venv with and without read children (ENVVAULT_READ_CHILDREN, vault/children.py)
# and with the pack writer's in-flight bounds patched, alternately, beside tar | zstd -3 in each round; then one
# ENVVAULT_STAGES=1 run of each setting.
# Usage (repository root, carried wheels in .whl/): OUT=$OUT bash bench/gpu_children.sh ROUNDS SETTING...
#   SETTING = READERS:CHILDREN[:COMPRESSORS[:FRAMES_A_COMPRESSOR[:IN_FLIGHT_MIB]]] (empty: envvault's default;
#   CHILDREN 0: none, the code before). Writes $OUT/gpu_children.txt.
set -u
ROUNDS=$1; shift
PY=python3
VENV=$($PY -c 'import sys; print(sys.prefix)')
rm -rf /tmp/site /tmp/ch && mkdir -p /tmp/ch
$PY -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
log=${OUT:-/tmp}/gpu_children.txt
: >"$log"
ZC='import sys, zstandard; zstandard.ZstdCompressor(level=3, threads=-1).copy_stream(sys.stdin.buffer, sys.stdout.buffer)'
# wall and peak RSS of one command (its largest process's), from Python: the host may lack /usr/bin/time
RUN='import resource, subprocess, sys, time
t = time.perf_counter(); rc = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL)
print(f"{time.perf_counter() - t:.2f} s rc {rc} RSS {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024} MB")'
snap() {  # SETTING, then extra environment assignments
  local s=$1; shift
  IFS=: read -r r c comp frames mib <<<"$s"
  local patch="import sys; from envvault.vault import packs"
  [ -n "${frames:-}" ] && patch="$patch; packs.PackWriter._in_flight_a_worker = $frames"
  [ -n "${mib:-}" ] && patch="$patch; packs._IN_FLIGHT_BYTES = $mib << 20"
  patch="$patch; from envvault.cli import main; sys.argv[0] = 'envvault'; main()"
  env "$@" ENVVAULT_READERS=$r ENVVAULT_READ_CHILDREN=$c ${comp:+ENVVAULT_COMPRESSORS=$comp} PYTHONPATH=/tmp/site \
    ENVVAULT_HOME=/tmp/ch/v $PY -c "$RUN" $PY -c "$patch" snap --venv "$VENV" --no-caches -m ch
}
tar -cf - -C "$VENV" . | cat >/dev/null
for i in $(seq "$ROUNDS"); do
  rm -f /tmp/ch/a.tar.zst && sync
  echo "anchor tar|zstd round $i: $(PYTHONPATH=/tmp/site $PY -c "$RUN" bash -c "tar -cf - -C $VENV . | $PY -c '$ZC' >/tmp/ch/a.tar.zst")" | tee -a "$log"
  for s in "$@"; do
    rm -rf /tmp/ch/v && sync
    echo "snap $s round $i: $(snap "$s")" | tee -a "$log"
  done
done
for s in "$@"; do
  rm -rf /tmp/ch/v && sync
  echo "== stages $s" >>"$log"
  snap "$s" ENVVAULT_STAGES=1 2>&1 | sed 's/^envvault-stage //' >>"$log"
done
du -sb /tmp/ch/v | tee -a "$log"
