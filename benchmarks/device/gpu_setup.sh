#!/usr/bin/env bash
# Device calls 1 .. N-1 (call k carries .gpu/pk, from benchmarks/device/stage.sh): keep this call's part of the
# bundle in /tmp/stage for the last call (benchmarks/device/gpu_run.sh). The first also shows the GPU. Call the next
# at once: a machine stays warm 30 s.
set -x
mkdir -p /tmp/stage
cp .gpu/p*/part* /tmp/stage/
ls -la /tmp/stage
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
