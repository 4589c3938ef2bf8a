"""Thin kopf handlers: the spec path on create/update/resume, periodic loops started at startup.

* ``@kopf.on.create`` / ``update`` / ``resume`` -> :meth:`.reconcile.Reconciler.apply_children`
  (level-based: renders and applies the children from the current spec; no Prometheus).
* ``@kopf.on.event`` -> :class:`.ticker.Tracker` (the latest body of each object, for the loops).
* ``@kopf.on.event`` on Secrets labelled ``sluiceway.io/tenant-key: "true"`` (the API server
  filters by that label: :func:`.settings.apply_kopf_settings`; the operator's RBAC cannot): a
  changed, new or removed key Secret re-applies, through a :class:`.ticker.Debouncer`
  (:data:`KEY_DEBOUNCE_SECONDS`), every InferenceService of its namespace whose
  ``tenants[].keySecretRef`` names it, so a rotated key reaches the ``<name>-keys`` Secret (and the
  pods and the gateway, which reload it in place) in about a second instead of at the next drift
  tick. Only the Secret's metadata is used here; its data is never kept or logged.
* ``@kopf.on.startup`` starts two :class:`.ticker.Ticker` loops - ``drift`` (every
  ``--drift-interval``: the spec path again, which repairs drift and picks up Secrets created later)
  and ``signals`` (every ``--signals-interval``: Prometheus status and the builtin engine);
  ``@kopf.on.cleanup`` stops them.

Only public kopf API is used. No handler needs a finalizer (kopf's timers would add one), so
deleting an InferenceService never waits for the operator; the children go by garbage collection.

Concurrency model: kopf runs these sync handlers in its thread pool and never runs two change
handlers of one object at once; the loops run in their own threads. All of them go through one
:class:`.reconcile.Reconciler`, which serialises the work on each object with a per-object lock
(see its docstring). Handlers return ``None`` (kopf stores nothing in ``status``); the reconciler
writes the status itself.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from . import GROUP, PLURAL, VERSION
from .kube import TENANT_KEY_LABEL, ApiError, Kube
from .reconcile import Reconciler
from .settings import OperatorConfig, apply_kopf_settings
from .ticker import Debouncer, SecretVersions, Ticker, Tracker

__all__ = ["KEY_DEBOUNCE_SECONDS", "register"]

#: Worker threads of the two loops together (Prometheus reads block up to their timeout).
LOOP_WORKERS = 4
#: A changed tenant-key Secret re-applies its InferenceServices this long after the first change
#: (changes within it join: a rotation of several Secrets is one pass per InferenceService).
KEY_DEBOUNCE_SECONDS = 1.0


def register(registry: kopf.OperatorRegistry, config: OperatorConfig, kube: Kube | None = None) -> None:
    """Register the handlers for one operator run. ``kube`` is created lazily at startup if None."""
    tracker = Tracker()
    versions = SecretVersions()
    holder: dict[str, Any] = {}

    def reconciler() -> Reconciler:
        rec: Reconciler = holder["reconciler"]
        return rec

    @kopf.on.login(registry=registry)
    def _login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A custom registry does not get kopf's default login handlers: use the kubernetes client's
        # configuration (in-cluster ServiceAccount, else KUBECONFIG / ~/.kube/config).
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        apply_kopf_settings(settings)
        rec = Reconciler(config, kube if kube is not None else Kube())
        holder["reconciler"] = rec
        pool = ThreadPoolExecutor(max_workers=LOOP_WORKERS, thread_name_prefix="sluiceway-loop")
        holder["pool"] = pool
        holder["tickers"] = [
            Ticker("drift", config.drift_interval, tracker, rec.drift_tick, pool),
            Ticker("signals", config.signals_interval, tracker, rec.signals_tick, pool),
        ]
        holder["keys"] = Debouncer(KEY_DEBOUNCE_SECONDS, tracker.get, rec.drift_tick, pool)
        for t in holder["tickers"]:
            t.start()
        holder["keys"].start()

    @kopf.on.cleanup(registry=registry)
    def _cleanup(**_: Any) -> None:
        for t in holder.get("tickers", []):
            t.stop()
        if "keys" in holder:
            holder["keys"].stop()
        if "pool" in holder:
            holder["pool"].shutdown(wait=False, cancel_futures=True)

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    def _track(type: str | None, body: kopf.Body, **_: Any) -> None:
        tracker.seen(type, dict(body))
        if type == "DELETED" and "reconciler" in holder:
            reconciler().forget(body["metadata"]["uid"])

    @kopf.on.event("v1", "secrets", registry=registry)
    def _key_secret(type: str | None, body: kopf.Body, **_: Any) -> None:
        # The API server sends only labelled Secrets (the watch's selector), and DELETED when one
        # loses its label; that body may show the label gone, so it is checked on the others only.
        meta = body.get("metadata") or {}
        if type != "DELETED" and (meta.get("labels") or {}).get(TENANT_KEY_LABEL) != "true":
            return
        if "keys" not in holder or not versions.changed(type, meta):
            return
        for uid in tracker.using_key_secret(str(meta.get("namespace") or ""), str(meta.get("name") or "")):
            holder["keys"].poke(uid)

    def _apply(body: kopf.Body, **_: Any) -> None:
        if body["metadata"].get("deletionTimestamp"):
            return
        tracker.seen("MODIFIED", dict(body))
        try:
            reconciler().apply_children(dict(body))
        except ApiError as err:
            raise kopf.TemporaryError(str(err), delay=10) from err

    for decorator in (
        kopf.on.create(GROUP, VERSION, PLURAL, id="apply-create", registry=registry),
        kopf.on.update(GROUP, VERSION, PLURAL, id="apply-update", registry=registry),
        kopf.on.resume(GROUP, VERSION, PLURAL, id="apply-resume", registry=registry),
    ):
        decorator(_apply)
