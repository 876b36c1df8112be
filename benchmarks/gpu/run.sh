#!/usr/bin/env bash
# The GPU check in one device call: installs what travelled in .gpu/ (benchmarks/gpu/bundle.sh), then runs
# benchmarks/gpu/check.py, which writes $OUT/gpu_check.md (the table), gpu_check.json and gpu_check.log.
#
#   bash benchmarks/gpu/run.sh [check.py's options]      # on the GPU machine, from the checkout's root
#   bash benchmarks/gpu/run.sh --dry-run                 # anywhere: on the CPU, tiny (tests/benchmarks)
#
# TFORMER_PYTHON: the Python to run (default python3, the GPU machine's, which has torch with CUDA). Without $OUT
# the files go to gpu-check-out/. Everything it installs or unpacks goes to /tmp/tformer-gpu (kept while the
# machine stays warm: a second call skips the installation and reuses the checkpoints).
set -uo pipefail
TFORMER_GPU_CHECK_STARTED=$(date +%s)  # check.py's time budget counts from here
export TFORMER_GPU_CHECK_STARTED
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root" || exit 2
python="${TFORMER_PYTHON:-python3}"
out="${OUT:-$root/gpu-check-out}"
mkdir -p "$out"
for argument in "$@"; do
  if [ "$argument" = "--dry-run" ]; then
    exec "$python" benchmarks/gpu/check.py --out "$out" "$@"
  fi
done

base=/tmp/tformer-gpu
mkdir -p "$base"
# A folder named site-packages: Streamlit takes itself for a development checkout anywhere else (global.developmentMode,
# which refuses --server.port).
if [ -d .gpu/wheels ]; then
  listed="$(ls .gpu/wheels)"
  if [ "$(cat "$base/site.list" 2>/dev/null)" != "$listed" ]; then
    rm -rf "$base/site-packages"
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$base/site-packages" \
      .gpu/wheels/*.whl || { echo "run.sh: the wheels in .gpu/wheels did not install" >&2; exit 1; }
    echo "$listed" >"$base/site.list"
  fi
  export PYTHONPATH="$base/site-packages${PYTHONPATH:+:$PYTHONPATH}"
else
  echo "run.sh: no .gpu/wheels (benchmarks/gpu/bundle.sh, then carry [\".gpu\"]): using what is installed" >&2
fi

# Debian's nginx for deploy/ when the machine has none: unpacked, and started through a wrapper on PATH that adds
# the carried libraries only when the binary lacks one of the machine's.
if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ] && ls .gpu/debs/nginx_*.deb >/dev/null 2>&1; then
  for deb in .gpu/debs/*.deb; do dpkg-deb -x "$deb" "$base/root"; done
  real="$base/root/usr/sbin/nginx"
  libraries=""
  if ldd "$real" | grep -q "not found"; then
    libraries="LD_LIBRARY_PATH=$base/root/usr/lib/x86_64-linux-gnu:$base/root/lib/x86_64-linux-gnu"
  fi
  mkdir -p "$base/bin"
  printf '#!/bin/sh\nexec env %s %s "$@"\n' "$libraries" "$real" >"$base/bin/nginx"
  chmod +x "$base/bin/nginx"
  export PATH="$base/bin:$PATH"
  "$base/bin/nginx" -v || echo "run.sh: the carried nginx does not start; the load part will say so" >&2
fi

"$python" benchmarks/gpu/check.py --out "$out" --work "$base/work" "$@"
