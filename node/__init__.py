"""One node as a library: policy, tasks and rewards, rollout path, learner, MNPO, telemetry; its CLI and observer.

* ``config``    -- pydantic models of a node's configuration (no torch)
* ``seams``     -- typed seams (Protocols) for policy, engine, tasks, learner and a side phase; ``GenerationSettings``,
  ``TrainSample``
* ``tasks/``    -- task families behind one plug-in interface (reasoning-gym, laboratory, installed plug-ins, verifiers
  environments), addressed by TaskRef; answer extraction and scoring; the 3-sided split
* ``canonical`` -- the canonical problem the split hashes (arithmetic value-level and family-independent)
* ``arith``     -- the laboratory families ``lab_add``/``lab_sub`` (registered with reasoning-gym), their traces
* ``runtime``   -- the node loop (generate, publish, SAPO mix, learn, checkpoint)
* ``eval``      -- evaluation on the dev or test side: questions no node trains on
* ``model/``    -- the policy: load a causal LM (built-in tiny, packaged SmolLM2, local dir, hub), build, cache
* ``rollout/``  -- prompt -> completions: planner (the one generate path), APRIL, engines, own groups
* ``learn/``    -- samples -> update: batch, losses, learner, checkpoints
* ``mnpo/``     -- the MNPO phase and its preference oracles
* ``telemetry/`` -- metrics.jsonl, the live view, trackers
* ``observer/`` -- the dashboard process (``swarm-node watch``), no torch in its own process
* ``cli/``      -- ``swarm-node`` and what it shares with ``swarm-sim`` (preflight, logs)

Layers, top to bottom (an import-linter contract): ``cli`` -> ``observer`` -> ``runtime`` -> ``eval`` | ``mnpo`` ->
``learn`` | ``rollout`` -> ``model`` | ``telemetry`` -> ``seams`` -> ``tasks`` -> ``canonical`` | ``config`` |
``arith``.

Components, as ``file [config section] <- called by -> calls``:

* ``runtime.Node`` [all of ``NodeConfig``] <- ``cli/join``, ``sim/inprocess`` -> planner, groups, channel, SAPO
  sampler, batch, learner, step phase, eval, telemetry
* ``runtime.build_parts`` [``model``, ``rollout``, ``vllm``, ``learner``] <- ``cli/join``, ``sim/inprocess`` ->
  ``model/policy``, an engine, the learner
* ``rollout/planner`` [``rollout``, ``vade``, ``dart``, ``april``] <- ``Node.generate``, the MNPO phase -> tasks,
  the engine, ``rollout/april``
* ``rollout/engine`` [``rollout``: generation settings, batch size] <- planner, ``rollout/april``, ``eval`` -> the
  policy's model
* ``rollout/engine_vllm`` [``vllm``, ``rollout``] <- ``build_parts`` -> vLLM, in the node's process or a server
* ``rollout/groups`` <- ``Node.generate``, the MNPO phase -> the tasks' verifier
* ``learn/batch`` [``sapo.peer_importance_weights``, ``learner``] <- ``Node.make_batch``, the MNPO phase -> the
  tokenizer, ``learn/losses.advantages_for``
* ``learn/learner`` [``learner``] <- ``Node.learn``, the MNPO phase -> the ``learn/losses`` registry, the optimizer
* ``learn/checkpoint`` [``checkpoint``] <- ``Node``, ``eval``, ``cli/export`` -> safetensors files
* ``mnpo/phase`` [``mnpo``] <- ``Node`` (a ``StepPhase``) -> planner, batch, learner, ``mnpo/oracles``,
  ``swarm.mnpo``, the channel
* ``eval`` [``eval``] <- ``Node``, ``swarm-node eval`` -> tasks, the engine (sampled and greedy)
* ``tasks`` [``tasks``] <- planner, ``Node``, ``eval``, the observer -> reasoning-gym, plug-ins (time-limited)
* ``telemetry`` [``report_to``, ``runtime``] <- ``Node``, ``cli/export``, ``sim/report`` -> JSONL files, trackers
* ``observer`` [``transport``, ``protocol``] <- ``swarm-node watch`` -> its reader child, the tasks' verifier, HTTP

Public names resolve lazily (importing ``node`` imports no torch).
"""

from protocol.lazy import lazy_exports

__all__ = ["Node", "NodeConfig", "NodeParts", "TaskSource", "build_parts"]
__getattr__ = lazy_exports(
    __name__,
    {
        "Node": "runtime",
        "NodeParts": "runtime",
        "build_parts": "runtime",
        "NodeConfig": "config",
        "TaskSource": "tasks",
    },
)
