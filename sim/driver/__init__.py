"""The experiment driver: one way to run any registered learning experiment (``swarm-sim experiment CONFIG``).

A registered experiment is a ``configs/sim/*.yaml`` with a ``registration:`` block (``sim.registration``); the
driver runs its arms for paired seeds, in-process or as real processes (the YAML's ``mode``), resumes pair by pair,
and writes a report whose verdict is the registered rule. Modules, top to bottom:

* ``main``       -- the command: load, refuse another registration's results, run what is missing, write
* ``pairs``      -- per-arm keys, saved and finished pairs, running the pending ones (seed by seed)
* ``start``      -- the shared start and the stock model, evaluated once for every pair; per-seed starts
* ``report``     -- the Markdown report and the plot
* ``tables``     -- docs/benchmarks.md's and the README's tables from every committed result (``benchmarks/tables.py``)
* ``analysis``   -- per-arm numbers, paired differences, 95% t-intervals, the verdict
* ``provenance`` -- the registration hash's checks and the commits the report names (git)
* ``metrics``    -- metric hooks by name (``exact``, ``gap_closed``)
* ``records``    -- a finished pair's evaluations read into one record
* ``legacy``     -- pre-driver result JSON (B7's runs, B6-real, the lab gate) read into records
* ``stats``      -- seeds and t-intervals
* ``machine``    -- the machine line of every results file

Imports torch and the node only inside the functions that run or evaluate models.
"""
