"""The simulator: many nodes on one machine, faults, experiments, reports.

* ``cli``         -- ``swarm-sim``
* ``runner``      -- every configuration x seed of an experiment
* ``initial``     -- initial models evaluated once (step 0) for every run that starts from them
* ``inprocess``   -- N nodes on one event loop over the memory transport, deterministic given a seed
* ``multiproc``   -- N real ``swarm-node join`` processes over hivemind on 127.0.0.1
* ``netlab``      -- a network lab in namespaces: public hosts, homes behind NAT routers, slow lossy links (root)
* ``config``      -- the experiment YAML (``SimConfig``): nodes, steps, seeds, variants, faults, adversaries
* ``scripted``    -- a cheap scripted policy/tasks/engine/learner for scale and unit tests
* ``adversary``   -- hostile peers built from the fault-injecting transport wrappers
* ``faults``      -- composable transport wrappers injecting drop, delay, duplicate, tamper, replay, flood, forge
* ``experiments`` -- experiment-specific runs and reports (the MNPO population game of B6)
* ``report``      -- results.csv / results.md / rewards.png, report.html, progress lines

Layers, top to bottom: ``cli`` -> ``runner`` -> ``initial`` | ``experiments`` | ``inprocess`` | ``multiproc`` |
``netlab`` -> ``adversary`` -> ``faults`` | ``scripted`` | ``report`` -> ``config``. Imports ``node``, ``swarm`` and
``protocol``; nothing in those imports the simulator. Public names resolve lazily (``swarm-sim --help`` stays instant).
"""

from protocol.lazy import lazy_exports

__all__ = ["SimConfig", "load_sim_config", "run_experiment", "write_report"]
__getattr__ = lazy_exports(
    __name__,
    {
        "SimConfig": "config",
        "load_sim_config": "config",
        "run_experiment": "runner",
        "write_report": "report",
    },
)
