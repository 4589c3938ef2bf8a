"""Per-request routing: a pure decision over the ledger, with the RNG injected.

* ``leastWait``: the pod with the shortest :func:`~sluiceway_gateway.ledger.predicted_wait_ms`, exact
  over up to :data:`EXACT_LIMIT` candidates (ties broken at random), power-of-two choices above.
* ``powerOfTwo``: two distinct candidates at random, the shorter predicted wait.
* ``random``: one candidate at random.

Draining and unreachable pods are never candidates; nor is a pod in ``exclude`` (the one that just
refused this request). :func:`retryable` says which pod answers may be retried on another pod: only
refusals made before any work (docs/gateway.md).

Concurrency model: pure functions, no I/O, no clock; called on the event loop.
"""

from __future__ import annotations

import json
import random
from collections.abc import Collection, Sequence

from .config import Routing
from .ledger import PodLoad, predicted_wait_ms, routable

EXACT_LIMIT = 16

#: pod refusals made before the request did any work: safe to send elsewhere once
RETRYABLE_REASONS: dict[int, frozenset[str]] = {
    429: frozenset({"queue_full", "displaced"}),
    503: frozenset({"not_ready", "draining"}),
}


def choose(
    pods: Sequence[PodLoad], policy: Routing, rng: random.Random, exclude: Collection[str] = ()
) -> PodLoad | None:
    """The pod for one request, or ``None`` when no pod may take it."""
    cands = [p for p in pods if routable(p) and p.key not in exclude]
    n = len(cands)
    if n == 0:
        return None
    if n == 1:
        return cands[0]
    if policy == "random":
        return cands[rng.randrange(n)]
    if policy == "leastWait" and n <= EXACT_LIMIT:
        best: list[PodLoad] = []
        best_w = float("inf")
        for p in cands:
            w = predicted_wait_ms(p)
            if w < best_w - 1e-9:
                best, best_w = [p], w
            elif abs(w - best_w) <= 1e-9:
                best.append(p)
        return best[0] if len(best) == 1 else best[rng.randrange(len(best))]
    i = rng.randrange(n)
    j = rng.randrange(n - 1)
    if j >= i:
        j += 1
    a, b = cands[i], cands[j]
    return a if predicted_wait_ms(a) <= predicted_wait_ms(b) else b


def refusal_reason(body: bytes) -> str | None:
    """The ``reason`` of a pod's JSON error body, or ``None``."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    reason = doc.get("reason") if isinstance(doc, dict) else None
    return reason if isinstance(reason, str) else None


def retryable(status: int, reason: str | None) -> bool:
    """A pod's answer that refused the request before doing any work."""
    return reason is not None and reason in RETRYABLE_REASONS.get(status, frozenset())
