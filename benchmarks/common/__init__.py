"""What the benchmarks outside the experiment driver share.

* ``machine`` -- the machine line every results file starts with (it lives in ``sim.driver.machine``)
"""
