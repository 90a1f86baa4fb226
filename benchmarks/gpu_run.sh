#!/bin/sh
# The real-GPU check on a GPU machine that cannot reach a package index.
#
# Here, with network access:  make gpu-wheels   (nvitop-exporter, the peer it is compared
# with, as wheels in .whl/). There, from the repository root, with .whl/ copied along:
#
#     sh benchmarks/gpu_run.sh [gpu_check.py options]
#
# installs the wheels into /tmp/l9gpu-site (the machine's own Python keeps its PyTorch,
# nvidia-ml-py, aiohttp and prometheus-client) and runs benchmarks/gpu_check.py. With $OUT
# set, the reports and a copy of this output are written there.
set -e
cd "$(dirname "$0")/.."
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/l9gpu-site .whl/*.whl
    PYTHONPATH="/tmp/l9gpu-site${PYTHONPATH:+:$PYTHONPATH}"
    export PYTHONPATH
fi
export PYTHONUNBUFFERED=1
if [ -n "$OUT" ]; then
    status=0
    python3 benchmarks/gpu_check.py "$@" >"$OUT/gpu_check.log" 2>&1 || status=$?
    cat "$OUT/gpu_check.log"
    exit "$status"
fi
exec python3 benchmarks/gpu_check.py "$@"
