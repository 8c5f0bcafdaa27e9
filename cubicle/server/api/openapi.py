"""The service's OpenAPI document as it really answers: errors, statuses and links.

FastAPI describes a 422 as its own `HTTPValidationError`, but every error of this service,
422 included, answers as an `ErrorBody` (`cubicle.server.api.errors`). This module rewrites the
generated document once, on first request of `/openapi.json`:

- every `/api` operation answers errors as `ErrorBody` (its 422, and `default` for the
  statuses of the error tree: 401, 404, 409, 410, 413, 429, 5xx);
- OpenAPI links lead from `POST /api/desktops` to every operation on `{desktop_id}`, and
  from `POST /api/tasks` to every operation on `{task_id}`, so that a client (or a fuzzer)
  can follow real ids from one call to the next;
- tuples in response schemas (`prefixItems`) are also stated as plain `items`: some
  OpenAPI tools (Schemathesis up to 4.32 at least) turn `prefixItems` into the draft-4
  `items: [...]` form and then reject it when checking a response; a response is what the
  service sends, so the looser form stays true of it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from cubicle.protocol.errors import ErrorBody

_ERROR_REF = {"$ref": "#/components/schemas/ErrorBody"}
_ERROR_CONTENT = {"application/json": {"schema": _ERROR_REF}}
_ERROR_TEXT = "An error (`ErrorBody`): what went wrong and what to do about it"
_LINK_SOURCES = {
    "desktop_id": ("/api/desktops", "post", "201"),
    "task_id": ("/api/tasks", "post", "201"),
}
"""Path parameter → the operation whose answer's `id` gives it (path, method, status)."""
_METHODS = ("get", "put", "post", "delete", "patch")


def install(app: FastAPI) -> None:
    """Serve the rewritten document at `/openapi.json` (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title,
                version=app.version,
                summary=app.summary,
                description=app.description,
                routes=app.routes,
            )
            app.openapi_schema = rewrite(document)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def rewrite(document: dict[str, Any]) -> dict[str, Any]:
    """The document with `ErrorBody` errors, id links and response tuples as `items`."""
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas["ErrorBody"] = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
    for path, _, operation in _operations(document):
        responses = operation.setdefault("responses", {})
        if "422" in responses:
            responses["422"]["content"] = copy.deepcopy(_ERROR_CONTENT)
        if path.startswith("/api"):
            responses.setdefault("default", {"description": _ERROR_TEXT, "content": _ERROR_CONTENT})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    _add_links(document)
    _loosen_response_tuples(document)
    return document


def _operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in document.get("paths", {}).items():
        for method in _METHODS:
            if method in item:
                yield path, method, item[method]


def _add_links(document: dict[str, Any]) -> None:
    paths = document.get("paths", {})
    for parameter, (source_path, source_method, status) in _LINK_SOURCES.items():
        source = paths.get(source_path, {}).get(source_method)
        if source is None or status not in source.get("responses", {}):
            continue
        links = source["responses"][status].setdefault("links", {})
        for path, _, operation in _operations(document):
            if "{" + parameter + "}" not in path or "operationId" not in operation:
                continue
            links[operation["operationId"]] = {
                "operationId": operation["operationId"],
                "parameters": {f"path.{parameter}": "$response.body#/id"},
            }


def _loosen_response_tuples(document: dict[str, Any]) -> None:
    """Give response-side copies of components with tuples plain `items` (see above)."""
    schemas = document["components"]["schemas"]
    tupled = {name for name, schema in schemas.items() if _has_tuple(schema)}
    if not tupled:
        return
    for _, _, operation in _operations(document):
        for response in operation.get("responses", {}).values():
            for media in response.get("content", {}).values():
                if "schema" in media:
                    media["schema"] = _output_refs(media["schema"], tupled, schemas)


def _has_tuple(schema: Any) -> bool:
    if isinstance(schema, dict):
        return "prefixItems" in schema or any(_has_tuple(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_has_tuple(v) for v in schema)
    return False


def _output_refs(schema: Any, tupled: set[str], schemas: dict[str, Any]) -> Any:
    """`schema` with refs to tupled components pointing at their `-Response` copies."""
    if isinstance(schema, list):
        return [_output_refs(v, tupled, schemas) for v in schema]
    if not isinstance(schema, dict):
        return schema
    ref = schema.get("$ref", "")
    name = ref.rsplit("/", 1)[-1]
    if name in tupled:
        copy_name = f"{name}-Response"
        if copy_name not in schemas:
            schemas[copy_name] = _as_items(copy.deepcopy(schemas[name]))
        return {**schema, "$ref": f"#/components/schemas/{copy_name}"}
    if "prefixItems" in schema:
        return _as_items(copy.deepcopy(schema))
    return {k: _output_refs(v, tupled, schemas) for k, v in schema.items()}


def _as_items(schema: Any) -> Any:
    """Each `prefixItems` tuple as `items` that every member satisfies."""
    if isinstance(schema, list):
        return [_as_items(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    schema = {k: _as_items(v) for k, v in schema.items()}
    members = schema.pop("prefixItems", None)
    if members is not None:
        schema["items"] = {"anyOf": members} if len(members) > 1 else members[0]
    return schema
