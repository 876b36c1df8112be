#!/usr/bin/env bash
# Gathers into .gpu/ (ignored by git) what the GPU check needs that the GPU machine lacks, then prints the sizes of
# what a device call carries: the checkout's working tree and .gpu/, together at most 64 MiB.
#
#   benchmarks/gpu/bundle.sh            # from any folder; uses the checkout's .venv (TFORMER_PYTHON to choose)
#
# .gpu/wheels  the packages of wheels.txt for the GPU machine's Python 3.12 (x86-64), at the versions this
#              checkout's environment has installed (pip download --no-deps: each needed one is named there)
# .gpu/debs    Debian's nginx, and the libraries it links, for when the machine lacks them (apt-get download)
# .gpu/models  MiniLM-L6's config and tokenizer, DeiT-Tiny's config and preprocessing: no weights
# .gpu/images  the photos ../shared/images holds (benchmarks/vision.py cuts its pictures from them)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
python="${TFORMER_PYTHON:-$root/.venv/bin/python}"
dest=.gpu
limit=$((64 * 1024 * 1024))

rm -rf "$dest"
mkdir -p "$dest/wheels" "$dest/debs" "$dest/models" "$dest/images"

# Each wheel at the version installed here, so the GPU machine runs what CI tests.
pins=$("$python" - <<'EOF'
import importlib.metadata as m
names = [l.split("#")[0].strip() for l in open("benchmarks/gpu/wheels.txt")]
print(" ".join(f"{n}=={m.version(n)}" for n in names if n))
EOF
)
platforms=""
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
  manylinux1_x86_64 any; do
  platforms="$platforms --platform $p"
done
# shellcheck disable=SC2086  # the pins and platforms are words
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  $platforms -d "$dest/wheels" $pins 2> >(grep -v "is ignored: it is neither" >&2)

# nginx for deploy/: the binary, and the libraries it links in case the machine has not got them (run.sh uses
# them only then). apt-get download writes into the current folder.
(cd "$dest/debs" && apt-get download nginx libpcre2-8-0 libssl3 libcrypt1 zlib1g 2>/dev/null) ||
  (apt-get update -qq && cd "$dest/debs" && apt-get download nginx libpcre2-8-0 libssl3 libcrypt1 zlib1g)

"$python" benchmarks/gpu/check.py --gather "$dest" >/dev/null

# What a device call carries: the working tree (tracked files and untracked ones git does not ignore) and .gpu/.
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null |
  awk '{s += $1} END {print s + 0}')
carried=$(find "$dest" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
echo "What travels with benchmarks/gpu/run.sh (carry [\"$dest\"]):"
for part in wheels debs models images; do
  printf '  %-8s %6.1f MB  %s\n' "$part" "$(du -sb "$dest/$part" | awk '{print $1 / 1e6}')" \
    "$(ls "$dest/$part" | tr '\n' ' ' | cut -c1-150)"
done
printf '  %-8s %6.1f MB\n  %-8s %6.1f MB\n' ".gpu" "$(echo "$carried" | awk '{print $1 / 1e6}')" \
  "tree" "$(echo "$tree" | awk '{print $1 / 1e6}')"
total=$((tree + carried))
printf 'Together %.1f MiB of the 64 MiB a call carries.\n' "$(echo "$total" | awk '{print $1 / 1048576}')"
if [ "$total" -gt "$limit" ]; then
  echo "Over the limit: the call would be refused." >&2
  exit 1
fi
