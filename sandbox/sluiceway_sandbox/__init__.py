"""Sluiceway sandbox: the whole system on one machine (control plane, node agent, Helm, KEDA, Prometheus)."""
