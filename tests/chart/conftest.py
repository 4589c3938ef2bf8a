"""Fixtures of the chart tests: the real control plane from ``tests/operator/kubetools.py``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from kubetools import control_plane

__all__ = ["control_plane"]
