"""The simulator: many nodes on one machine, faults, experiments, reports.

* ``config``     -- the experiment YAML (``SimConfig``): nodes, steps, seeds, variants, faults, adversaries
* ``scripted``   -- a cheap scripted policy/tasks/engine/learner for scale and unit tests
* ``adversary``  -- hostile peers built from the protocol's fault-injecting transport wrappers
* ``inprocess``  -- N nodes on one event loop over the memory transport, deterministic given a seed
* ``multiproc``  -- N real ``swarm-node join`` processes over hivemind on 127.0.0.1
* ``runner``     -- every configuration x seed of an experiment
* ``report``     -- results.csv / results.md / rewards.png from the per-node metrics
* ``report_html`` -- the self-contained report.html (tables, inline SVG curves, per-node detail)
* ``experiments`` -- experiment-specific metrics and reports (the MNPO game, the SAPO analysis)
* ``progress``   -- progress lines (configuration, seed, step k/N, ETA) on stderr
* ``cli``        -- ``swarm-sim``
"""
