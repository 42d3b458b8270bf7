"""The benchmarks the project carries (``../shared/BENCHMARKS.md``): one command each, a Markdown table written to
``benchmarks/results/<name>.md`` with the machine and the date, and a quick mode that a test runs.

Learning experiments are registrations, not scripts: ``configs/sim/*.yaml`` with a ``registration:`` block, run by
``swarm-sim experiment`` (``sim.driver``); ``controls`` is the old command for three of them.

* ``b1_gossip``, ``b1_gossip_libp2p``, ``b1_gossip_mixed`` -- B1: record visibility over the real transports
* ``b2_rollout``, ``b2_april`` -- B2: the rollout engine against ``model.generate``; APRIL on a long-tail mix
* ``b3_learner`` -- B3: one learner step against TRL's ``GRPOTrainer`` loss on the same tensors
* ``b5_scale`` -- B5: per-node cost from 10 to 10,000 simulated nodes
* ``b6_mnpo``, ``b6_real`` -- B6: MNPO against two-player baselines (the game in ``sim.experiments.mnpo_game``)
* ``b7_generalization``, ``lab_gate`` -- B7: held-out accuracy of a node alone; the traces-vs-answers gate
* ``b8_learning``, ``b8_vllm_speed`` -- B8: SmolLM2-135M alone against its stock model; vLLM against transformers
* ``soak``, ``soak_multiproc``, ``flood``, ``sybil``, ``sybil_real``, ``netlab``, ``vade`` -- B9 soaks, attacks, the
  network lab, VADE/DART prompt selection
* ``tables`` -- docs/benchmarks.md's tables from the committed result JSON
* ``compare_runs`` -- two run trees line by line, timings aside (a refactor's behaviour check)
* ``common/`` -- the machine line, B1's harness and summary, the real-process runs

Retired scripts (history) are listed in docs/benchmarks.md. Benchmarks import ``sim``, ``node``, ``swarm`` and
``protocol``, and nothing imports them.
"""
