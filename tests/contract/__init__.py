"""Contract suites shared by every implementation of an interface (imported by per-implementation test modules)."""
