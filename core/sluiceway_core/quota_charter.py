"""The operator's signed statement of one InferenceService's quotas: what the quota coordinator
trusts, instead of whatever a caller claims.

The coordinator is reachable over the network, so a lease request must prove two things: that the
caller is a pod of the service it names, and that the quotas it carries are the ones in that
service's spec. The operator, which reads the spec, writes a :class:`QuotaCharter` (service, tenant
quotas, the most pods that may hold leases at once) into the pod's config, and its signature,
``HMAC-SHA256(key, canonical charter)``, into the pod's Secret. The key is shared by the operator and
the coordinator only (the chart's quota-key Secret in the release namespace). A pod sends the charter
and the signature with every renewal; the coordinator recomputes the signature and refuses anything
else, so:

- nobody without a pod's Secret (or the key) can take part in a service's leases;
- the quotas and the pod bound are the operator's view of the spec, never the caller's;
- a pod of one service cannot speak for another (the service name is inside what is signed).

The signature is a bearer secret of that one service: it appears only in the pod's Secret, never in
a ConfigMap, a log line, a metric or a status. Pure: no I/O except :func:`load_key`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluiceway_core.quota import MAX_TENANTS, QuotaError, TenantQuota

__all__ = [
    "MIN_KEY_BYTES",
    "QuotaCharter",
    "load_key",
    "sign_charter",
    "verify_charter",
]

#: Shorter keys are refused: an HMAC key must not be guessable.
MIN_KEY_BYTES = 32
_DOMAIN = b"sluiceway.io/quota-charter/v1\n"
_SIG_HEX = 64
MAX_PODS = 10_000  # the CRD's maxReplicas bound


@dataclass(frozen=True)
class QuotaCharter:
    """One service's quotas as the operator rendered them.

    ``max_pods`` bounds how many distinct pods the coordinator keeps leases for (the Deployment's
    ``maxReplicas`` plus its surge): more pod names than that cannot dilute the real pods' shares.
    """

    service: str  # "<namespace>/<name>"
    quotas: Mapping[str, TenantQuota]
    max_pods: int

    def to_json(self) -> dict[str, Any]:
        return {
            "service": self.service,
            "quotas": {t: self.quotas[t].to_json() for t in sorted(self.quotas)},
            "maxPods": self.max_pods,
        }

    def canonical(self) -> bytes:
        """The bytes that are signed: sorted keys, no spaces, so every renderer agrees."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"), allow_nan=False).encode()

    def digest(self) -> str:
        """A short public fingerprint (to tell two charters of one service apart; not a secret)."""
        return hashlib.sha256(self.canonical()).hexdigest()[:16]

    @classmethod
    def from_json(cls, doc: Any) -> QuotaCharter:
        """Validated; raises :class:`QuotaError`."""
        if not isinstance(doc, dict):
            raise QuotaError("charter must be an object")
        service = doc.get("service")
        if not isinstance(service, str) or service.count("/") != 1 or not 3 <= len(service) <= 253:
            raise QuotaError("charter.service must be '<namespace>/<name>'")
        quotas = doc.get("quotas")
        if not isinstance(quotas, dict) or len(quotas) > MAX_TENANTS:
            raise QuotaError(f"charter.quotas must be an object of at most {MAX_TENANTS} tenants")
        max_pods = doc.get("maxPods")
        if type(max_pods) is not int or not 1 <= max_pods <= MAX_PODS:
            raise QuotaError(f"charter.maxPods must be an integer within 1..{MAX_PODS}")
        parsed: dict[str, TenantQuota] = {}
        for tenant, q in quotas.items():
            # the grant's grammar (no spaces): a charter the pods could not use is refused here
            if not isinstance(tenant, str) or not 1 <= len(tenant) <= 253 or any(c.isspace() for c in tenant):
                raise QuotaError("charter.quotas: a tenant name must be 1..253 characters without spaces")
            parsed[tenant] = TenantQuota.from_json(q)
        return cls(service, parsed, max_pods)


def _mac(key: bytes, charter: QuotaCharter) -> str:
    if len(key) < MIN_KEY_BYTES:
        raise QuotaError(f"the quota key must be at least {MIN_KEY_BYTES} bytes")
    return hmac.new(key, _DOMAIN + charter.canonical(), hashlib.sha256).hexdigest()


def sign_charter(key: bytes, charter: QuotaCharter) -> str:
    """The charter's signature (64 hex characters): a secret of this service; put it in a Secret."""
    return _mac(key, charter)


def verify_charter(key: bytes, doc: Any, signature: Any) -> QuotaCharter:
    """The charter ``doc`` if ``signature`` is its signature under ``key``; raises :class:`QuotaError`
    with a message that never contains the signature or the key."""
    charter = QuotaCharter.from_json(doc)
    if not isinstance(signature, str) or len(signature) != _SIG_HEX:
        raise QuotaError("the charter's signature is missing or malformed")
    if not hmac.compare_digest(_mac(key, charter), signature.lower()):
        raise QuotaError("the charter's signature does not match: not signed by this cluster's operator")
    return charter


def load_key(path: str | Path) -> bytes:
    """The key file's bytes, surrounding whitespace removed. Raises ValueError (naming the path, never
    the content) if it cannot be read or is shorter than :data:`MIN_KEY_BYTES`."""
    try:
        key = Path(path).read_bytes().strip()
    except OSError as e:
        raise ValueError(f"cannot read the quota key file {path}: {e.strerror}") from None
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"the quota key file {path} holds fewer than {MIN_KEY_BYTES} bytes")
    return key
