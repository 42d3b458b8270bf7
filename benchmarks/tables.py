"""``python benchmarks/tables.py [--check]``: docs/benchmarks.md's and the README's generated tables
(``sim.driver.tables``)."""

import sys

from sim.driver.tables import main

if __name__ == "__main__":
    sys.exit(main())
