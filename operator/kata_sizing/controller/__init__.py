"""The operator: kopf's handlers, reconciliation, the watch caches, leader election,
the Kubernetes API wrapper (the only module that imports the client), the metrics and
the policy webhook. It imports the core, never the other way round.
"""
