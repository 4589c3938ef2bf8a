"""Sluiceway inference pod: an admission-controlled Open Inference Protocol v2 server.

Importing this package is cheap: torch, FastAPI and uvicorn are imported only by the modules that
need them (``models``, ``runtime``, ``app``, ``server``), so the operator can import
:mod:`sluiceway_core.config` and :mod:`sluiceway_core.queueing` without them.
"""

__version__ = "0.1.0"
