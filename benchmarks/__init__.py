"""The benchmarks the project carries (``../shared/BENCHMARKS.md``): one command each, a Markdown table written to
``benchmarks/results/<name>.md`` with the machine and the date, and a quick mode that a test runs.

Learning experiments are registrations, not scripts: ``configs/sim/*.yaml`` with a ``registration:`` block, run by
``swarm-sim experiment`` (``sim.driver``); ``controls`` is the old command for three of them.

* ``systems/`` -- what the swarm costs and survives: gossip, engine and learner speed, scale, soaks, attacks, the
  network lab, VADE (one harness, ``systems.harness``)
* ``b6_mnpo``, ``b6_real`` -- B6: MNPO against two-player baselines (the game in ``sim.experiments.mnpo_game``)
* ``b7_generalization``, ``lab_gate`` -- B7: held-out accuracy of a node alone; the traces-vs-answers gate
* ``b8_learning`` -- B8: SmolLM2-135M alone against its stock model
* ``tables`` -- docs/benchmarks.md's tables from the committed result JSON
* ``compare_runs`` -- two run trees line by line, timings aside (a refactor's behaviour check)
* ``common/`` -- the machine line, the real-process runs, plots

Retired scripts (history) are listed in docs/benchmarks.md. Benchmarks import ``sim``, ``node``, ``swarm`` and
``protocol``, and nothing imports them.
"""
