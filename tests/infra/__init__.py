"""Real test environment for tracker: Kafka, a Kubernetes control plane and a simulated Kueue cluster.

Run `python -m tests.infra up|down|status`; pytest uses it through `tests.infra.fixtures`.
"""
