"""Fixtures of the operator tests; the helpers live in ``kubetools`` (a unique module name)."""

from kubetools import control_plane

__all__ = ["control_plane"]
