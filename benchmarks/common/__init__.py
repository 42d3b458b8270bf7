"""What the learning benchmarks still outside the experiment driver share.

* ``machine`` -- the machine line every results file starts with (it lives in ``sim.driver.machine``)
* ``multirun`` -- real-process runs of (configuration, seed) pairs for B6's real-model section and B8
* ``plots`` -- side-by-side panels of held-out accuracy over steps
"""
