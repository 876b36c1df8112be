#!/bin/sh
# Run tformer for a class: K replicas behind nginx (see deploy/serve.py for the options), with the
# checkout's virtual environment. Example: deploy/run.sh --replicas 2 --port 8500 --cache-mb 768
set -eu
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${TFORMER_PYTHON:-$root/.venv/bin/python}"
exec "$python" "$root/deploy/serve.py" "$@"
