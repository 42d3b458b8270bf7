"""One node: policy, tasks and rewards, rollout engine, learner, checkpoints, runtime loop and CLI.

* ``config`` -- pydantic models of a node's configuration (no torch)
* ``cli``    -- ``swarm-node`` (imports heavy modules only inside commands)
"""
