"""A trace-driven autoscaling simulator: Sluiceway's scaling policy against the autoscalers people
run (KEDA's Prometheus trigger, the HPA on utilisation, Knative's KPA, Ray Serve) and an oracle.

Pure Python + numpy, seeded. See docs/scalesim.md for the model, its assumptions and the results.
"""
