"""The pure core: the policy model, Kata's rules, the sizing, the pod-fit rule, node
guidance, rendering, calibration and the audit. No Kubernetes client, no kopf, no I/O;
every import points inside this package.
"""
