"""The sluiceway operator: reconciles ``InferenceService`` objects (sluiceway.io/v1alpha1).

Layout (reconcile without I/O):

* :mod:`.spec` - the validated model of the CR spec (pure);
* :mod:`.render` - pure ``build_*`` functions, spec -> manifests;
* :mod:`.status` - pure condition computation;
* :mod:`.kube` - the only module that talks to the Kubernetes API;
* :mod:`.prom` - Prometheus queries for status and the built-in engine;
* :mod:`.reconcile` - the spec path and the signals path, with the per-object state and lock;
* :mod:`.ticker` - the periodic loops (drift repair, signals) without finalizers;
* :mod:`.handlers` - thin kopf handlers; :mod:`.settings` - kopf and operator settings;
* :mod:`.cli` - ``sluiceway-operator run``.
"""

GROUP = "sluiceway.io"
VERSION = "v1alpha1"
PLURAL = "inferenceservices"
KIND = "InferenceService"
FIELD_MANAGER = "sluiceway-operator"
