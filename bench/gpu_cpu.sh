# User and system CPU seconds of a first snap and of tar | zstd -3, twice each (bash time): whether the snap
# is short of cores or waiting. Usage on the device: bash bench/gpu_cpu.sh
source bench/gpu_site.sh
for i in 1 2; do
  TIMEFORMAT="anchor tar|zstd $i: wall %R s user %U s sys %S s"; time (tar -cf - -C "$VENV" . | $PY -c "$ZC" >/tmp/a.tar.zst)
  rm -rf /tmp/cv && sync
  TIMEFORMAT="first snap $i: wall %R s user %U s sys %S s"; time (ENVVAULT_HOME=/tmp/cv $PY -m envvault snap --venv "$VENV" --no-caches -m c >/dev/null)
done
