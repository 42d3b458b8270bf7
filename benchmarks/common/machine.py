"""The machine line every results file starts with; it lives with the experiment driver (``sim.driver.machine``)."""

from sim.driver.machine import machine_info

__all__ = ["machine_info"]
