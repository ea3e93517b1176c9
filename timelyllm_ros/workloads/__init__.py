"""Workloads: the workload file format and its expansion into arrivals (format.py), the LRTrace
task catalog (catalog.py), the seeded example generator of the tiny model's data (examples.py).
The YAML files themselves are the data directory `workloads/` at the repository root."""
