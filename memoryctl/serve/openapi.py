"""The OpenAPI 3.1 description of the service, generated from the operation table (never by hand)."""

from __future__ import annotations

from typing import Any

from memoryctl._version import __version__
from memoryctl.serve.operations import OPERATIONS, Operation, Param

ERROR = {
    "type": "object",
    "required": ["error", "exit_code"],
    "properties": {
        "error": {"type": "string"},
        "hint": {"type": ["string", "null"]},
        "exit_code": {"type": "integer", "description": "what the CLI exits with for this error"},
    },
}
REPLY_HEADERS = {
    "Memoryctl-Exit-Code": {
        "description": "the CLI's exit code for this reply: 0 ok, 3 partial (a store is behind or degraded)",
        "schema": {"type": "integer"},
    },
    "Memoryctl-Warnings": {
        "description": "JSON list of the lines the CLI prints on stderr (e.g. what is pending)",
        "schema": {"type": "string"},
    },
}


def _schema(p: Param) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": p.type, "description": p.description}
    if p.items:
        schema["items"] = {"type": p.items}
    return schema


def _errors() -> dict[str, Any]:
    described = {
        "400": "bad parameters or body",
        "401": "missing or wrong bearer token (HTTP only)",
        "404": "unknown operation or memory",
        "413": "body larger than serve.max_body_mb",
        "503": "a store is down, or the service is busy (Retry-After)",
        "500": "internal error (details in the service's log)",
    }
    return {
        code: {"description": text, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
        for code, text in described.items()
    }


def _operation(op: Operation) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "operationId": op.name,
        "summary": op.summary,
        "responses": {
            "200": {
                "description": f"exactly what `memoryctl {op.name} --json` prints",
                "headers": REPLY_HEADERS,
                "content": {"application/json": {"schema": {}}},
            },
            **_errors(),
        },
    }
    if op.upload:
        spec["parameters"] = [
            {"name": p.name, "in": "query", "required": p.required, "schema": _schema(p)} for p in op.params
        ]
        spec["requestBody"] = {
            "required": True,
            "description": "JSONL, one memory per line (the `memoryctl import` format)",
            "content": {"application/x-ndjson": {"schema": {"type": "string"}}},
        }
    else:
        spec["requestBody"] = {
            "required": any(p.required for p in op.params),
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": [p.name for p in op.params if p.required],
                        "properties": {p.name: _schema(p) for p in op.params},
                    }
                }
            },
        }
    return spec


def document() -> dict[str, Any]:
    paths: dict[str, Any] = {f"/v1/{name}": {"post": _operation(op)} for name, op in OPERATIONS.items()}
    paths["/v1/status"] = {
        "get": {
            "operationId": "status",
            "summary": "The service itself: pid, uptime, workers, queue, request counts.",
            "responses": {"200": {"description": "status", "content": {"application/json": {"schema": {}}}}},
        }
    }
    paths["/v1/openapi.json"] = {
        "get": {
            "operationId": "openapi",
            "summary": "This description.",
            "responses": {"200": {"description": "OpenAPI 3.1", "content": {"application/json": {"schema": {}}}}},
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "memoryctl",
            "version": __version__,
            "description": "The operations of the memoryctl CLI, answered by `memoryctl serve`. "
            "Over HTTP every request needs `Authorization: Bearer <token>`; over the Unix socket the "
            "socket's file mode is the access control.",
        },
        "servers": [{"url": "/"}],
        "components": {
            "schemas": {"Error": ERROR},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": paths,
    }
