"""The benchmarks the project carries (``../shared/BENCHMARKS.md``): one command each, a Markdown table written to
``benchmarks/results/<name>.md`` with the machine and the date, and a quick mode that a test runs.

Learning experiments are registrations, not scripts: ``configs/sim/*.yaml`` with a ``registration:`` block, run by
``swarm-sim experiment`` (``sim.driver``): the controls, B6-real, B7-lab and the lab gate; ``controls`` is the old
command for three of them.

* ``systems/`` -- what the swarm costs and survives: gossip, engine and learner speed, scale, soaks, attacks, the
  network lab, VADE (one harness, ``systems.harness``)
* ``tables`` -- docs/benchmarks.md's tables and the README's Results from the committed result JSON
* ``compare_runs`` -- two run trees line by line, timings aside (a refactor's behaviour check)
* ``common/`` -- the machine line

Retired scripts (history) are listed in docs/benchmarks.md. Benchmarks import ``sim``, ``node``, ``swarm`` and
``protocol``, and nothing imports them.
"""
