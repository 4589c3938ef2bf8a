"""Sluiceway benchmarks: an open-loop load generator, baselines and the benchmark drivers."""
