"""Model factories for the sandbox's own tests (``model.format: python``, ``model.source:
sluiceway_sandbox.testmodels:<factory>``). The sandbox's pod image is this Python installation, so
the real pod process imports them like any user's factory.

* :func:`crash_at_load`: a model whose load fails after ``$SANDBOX_MODEL_LOAD_SECONDS`` (default 4 s):
  the pod binds its port and answers ``503`` (loading) meanwhile, then its process exits with the
  load's error, and the node agent restarts it with the kubelet's back-off: a crash loop at load
  (tests/sandbox/test_scale_to_zero.py). The variable is not ``SLUICEWAY_*`` because ``spec.pod.env``
  may not set those.

Concurrency model: called once, on the pod's start thread; it blocks that thread only.
"""

from __future__ import annotations

import os
import time
from typing import NoReturn

LOAD_SECONDS_ENV = "SANDBOX_MODEL_LOAD_SECONDS"
CRASH_MESSAGE = "the model's load failed (sluiceway_sandbox.testmodels:crash_at_load)"


def crash_at_load() -> NoReturn:
    """Sleep ``$SANDBOX_MODEL_LOAD_SECONDS`` (a load under way), then fail the load."""
    time.sleep(float(os.environ.get(LOAD_SECONDS_ENV, "4")))
    raise RuntimeError(CRASH_MESSAGE)
