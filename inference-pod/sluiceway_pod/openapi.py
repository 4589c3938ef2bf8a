"""The OpenAPI 3.0 document of a pod's inference port, built from the served model's tensor specs.

Pure: :func:`openapi_document` returns a dict. The admin port serves it at ``/openapi.json``;
``tests/pod/test_openapi_fuzz.py`` drives schemathesis with it. The documented server faults are 503
and 504 only (load shedding, drain, execution budget); any other 5xx is a defect.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .models import TensorSpec

_ERROR = {
    "type": "object",
    "required": ["error", "reason"],
    "properties": {
        "error": {"type": "string", "minLength": 1},
        "reason": {"type": "string"},
        "errorId": {"type": "string"},
    },
}


def _err(description: str) -> dict[str, Any]:
    schema = {"$ref": "#/components/schemas/Error"}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _tensor_schema(specs: Sequence[TensorSpec]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["name", "shape", "datatype"],
        "properties": {
            "name": {"type": "string", "enum": [s.name for s in specs]},
            "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}, "maxItems": 8},
            "datatype": {"type": "string", "enum": sorted({s.datatype for s in specs})},
            "data": {"type": "array", "items": {"type": "number"}},
            "parameters": {"type": "object", "properties": {"binary_data_size": {"type": "integer"}}},
        },
    }


def openapi_document(model: str, inputs: Sequence[TensorSpec]) -> dict[str, Any]:
    """The inference port's API for a pod serving ``model`` with ``inputs``."""
    name = {"name": "name", "in": "path", "required": True, "schema": {"type": "string", "enum": [model]}}
    version = {"name": "version", "in": "path", "required": True, "schema": {"type": "string"}}
    auth = {"name": "Authorization", "in": "header", "required": False, "schema": {"type": "string"}}
    prio = {"name": "X-Sluiceway-Priority", "in": "header", "required": False, "schema": {"type": "string"}}
    deadline = {"name": "X-Sluiceway-Deadline-Ms", "in": "header", "required": False, "schema": {"type": "string"}}
    shed = {
        "400": _err("malformed body, tensor or header"),
        "401": _err("missing or unknown API key"),
        "403": _err("priority above the tenant's ceiling"),
        "404": _err("model not served here"),
        "408": _err("the body did not arrive in time"),
        "413": _err("body too large"),
        "429": _err("queue full, rate limited, displaced or overloaded (Retry-After)"),
        "503": _err("not ready, draining, queue timeout, deadline, device out of memory"),
        "504": _err("execution budget exceeded"),
    }
    infer_op = {
        "parameters": [auth, prio, deadline],
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "required": ["inputs"],
                        "properties": {
                            "id": {"type": "string"},
                            "inputs": {"type": "array", "items": _tensor_schema(inputs), "minItems": 1},
                            "outputs": {
                                "type": "array",
                                "items": {"type": "object", "properties": {"name": {"type": "string"}}},
                            },
                            "parameters": {"type": "object"},
                        },
                    }
                }
            },
        },
        "responses": {"200": {"description": "the outputs"}, **shed},
    }
    meta_op = {"parameters": [auth], "responses": {"200": {"description": "model metadata"}, **shed}}
    ready_op = {"parameters": [auth], "responses": {"200": {"description": "ready"}, **shed}}
    health = {"responses": {"200": {"description": "yes"}, "503": {"description": "no"}}}
    return {
        "openapi": "3.0.3",
        "info": {"title": f"sluiceway-pod ({model})", "version": "2"},
        "paths": {
            "/v2/health/live": {"get": health},
            "/v2/health/ready": {"get": health},
            "/v2": {"get": {"responses": {"200": {"description": "server metadata"}}}},
            "/v2/models/{name}": {"get": {**meta_op, "parameters": [name, auth]}},
            "/v2/models/{name}/versions/{version}": {"get": {**meta_op, "parameters": [name, version, auth]}},
            "/v2/models/{name}/ready": {"get": {**ready_op, "parameters": [name, auth]}},
            "/v2/models/{name}/versions/{version}/ready": {"get": {**ready_op, "parameters": [name, version, auth]}},
            "/v2/models/{name}/infer": {"post": {**infer_op, "parameters": [name, auth, prio, deadline]}},
            "/v2/models/{name}/versions/{version}/infer": {
                "post": {**infer_op, "parameters": [name, version, auth, prio, deadline]}
            },
        },
        "components": {"schemas": {"Error": _ERROR}},
    }
