"""sluiceway-gateway: the service edge in front of the inference pods.

HTTP/1.1 keep-alive on both sides, per-request routing on the pods' reported load, a retry of
requests a pod refused before doing any work, and tenant admission for the whole service.
Depends only on :mod:`sluiceway_core`. See docs/gateway.md.
"""

__all__: list[str] = []
