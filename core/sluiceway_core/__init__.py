"""Sluiceway's shared contracts and pure math.

Every component (the inference pod, the operator, the scaler, the sandbox, the benchmarks) depends
on this package and on nothing of each other's. It holds what crosses a process boundary or must be
computed the same way in two places:

- :mod:`.config`: the pod's configuration schema (what the operator's ConfigMap carries);
- :mod:`.units`: durations, rates and Kubernetes quantities (one grammar for every component);
- :mod:`.keys`: how tenant API keys are hashed (the operator writes hashes, the pod checks them);
- :mod:`.queueing`: queueing math (M/M/c, queue bounds) used by the pod and the planner;
- :mod:`.policy`: the scaling policy used by the scaler and the operator's builtin engine;
- :mod:`.metric_names`: the ``sluiceway_*`` metric names that pods export and rules, dashboards,
  the scaler and the operator read;
- :mod:`.signals`: the PromQL built from those names.

Rules: pure Python plus pydantic/pyyaml; no torch, FastAPI, uvicorn, kopf, kubernetes or grpc
imports (``importlinter`` contracts in ``pyproject.toml`` enforce it in CI). No I/O at import time.
"""

__version__ = "0.1.0"
