"""Sluiceway autoscaling: the shared scaling policy, the KEDA external scaler, the capacity planner."""
