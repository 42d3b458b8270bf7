"""One node: policy, tasks and rewards, rollout engine, learner, checkpoints, runtime loop and CLI.

* ``config``     -- pydantic models of a node's configuration (no torch)
* ``policy``     -- load a causal LM + tokenizer (hub name, local dir, or the built-in model); device/dtype
* ``tiny``       -- the built-in offline model: local BPE tokenizer, Qwen2 config, warm start, cached build
* ``tasks``      -- reasoning-gym task sources addressed by TaskRef; answer extraction and scoring
* ``engine``     -- rollout engine interface and the transformers backend (batched, KV cache, logprobs)
* ``engine_vllm``-- the vLLM backend (optional extra; GPU)
* ``april``      -- APRIL partial rollouts: over-provision, stop, buffer and continue
* ``planner``    -- per-step prompt planning (VADE selection, DART rollout counts)
* ``losses``     -- pure loss functions (GRPO family, truncated IS, MNPO, DPO) and their registry
* ``learner``    -- optimizer, micro-batching, importance weights, policy version
* ``checkpoint`` -- atomic safetensors checkpoints, resume
* ``mnpo``       -- the node's MNPO phase: shared window prompts, cross-scoring, pairs, update
* ``oracles``    -- preference oracles: verifiable reward, reward model, synthetic non-transitive
* ``metrics``    -- JSONL metrics that survive crashes; live terminal view
* ``runtime``    -- the node loop (generate, publish, SAPO mix, learn, checkpoint)
* ``join``       -- ``swarm-node join`` behind the argument parser (network, signals, shutdown)
* ``observer``   -- the swarm observer's state: validate records, re-score completions, aggregate (no torch)
* ``observer_reader`` -- the observer's child process that reads records from the transport as raw bytes
* ``observer_http``   -- the observer's read-only HTTP server (page in ``web/``, ``/api/state``)
* ``watch``      -- ``swarm-node watch``: observer + reader process + page
* ``cli``        -- ``swarm-node`` (imports heavy modules only inside commands)
"""
