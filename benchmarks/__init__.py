"""The benchmarks the project carries (``../shared/BENCHMARKS.md``): one command each, a Markdown table written to
``benchmarks/results/<name>.md`` with the machine and the date, and a quick mode that a test runs.

* ``b1_gossip``, ``b1_gossip_libp2p`` -- B1: record visibility over the real transports against raw hivemind/libp2p
* ``b2_rollout``, ``b2_april`` -- B2: the rollout engine against ``model.generate``; APRIL on a long-tail mix
* ``b3_learner`` -- B3: one learner step against TRL's ``GRPOTrainer`` loss on the same tensors
* ``b4_sapo`` -- B4: SAPO's I/J splits, populations, ablations (analysis in ``analysis/sapo_b4``)
* ``b5_scale`` -- B5: per-node cost from 10 to 10,000 simulated nodes
* ``b6_mnpo`` -- B6: MNPO against two-player baselines (the game in ``sim.experiments.mnpo_game``)
* ``b7_generalization`` -- B7: held-out accuracy of a node alone, before and after
* ``real_model`` -- B8: SmolLM2-135M offline
* ``soak``, ``sybil``, ``vade`` -- B9 soak; the sybil budget; VADE/DART prompt selection
* ``compare_runs`` -- two run trees line by line, timings aside (a refactor's behaviour check, with
  ``configs/sim/equivalence.yaml``)
* ``analysis/`` -- readers of the run directories; ``common/`` -- the machine line and B1's harness and summary

Layers, top to bottom: drivers -> ``analysis`` | ``common``; benchmarks import ``sim``, ``node``, ``swarm`` and
``protocol``, and nothing imports them.
"""
