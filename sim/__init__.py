"""The simulator: many nodes on one machine, faults, experiments, reports.

* ``cli`` -- ``swarm-sim``
"""
