"""The request bodies' schemas as msgspec decodes them, so the OpenAPI schema promises what the
server accepts.

Litestar's own generator loses some of what the bodies' structs enforce (a `ge=0` bound, a pattern
inside a union, `forbid_unknown_fields`), so a client, or schemathesis, could send a schema-valid
body the server refuses. msgspec's JSON Schema of the same structs is exact; when the schema is
first served it replaces Litestar's components for every struct a handler takes as `data`, with
three additions:

- what the raw-input rules (`api/body_rules.py`) refuse anywhere in a body: strings holding NUL
  and integers outside 64 bits (free-form values, such as unknown fields a body ignores, are
  described as `JsonValue`: scalars, and lists and objects of them);
- `AT_LEAST`: alternatives of which one must hold, that no field's type can say.

Only Litestar's public API is used: the app's `openapi_schema` object, which both schema paths
render, and the OpenAPI spec dataclasses.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Litestar
from litestar.openapi.spec import Discriminator, OpenAPIType, Reference, Schema
from litestar.routes import HTTPRoute

from horde_lite.accounts.limits import USER_LIMIT_FIELDS
from horde_lite.api.body_rules import INT64_MAX, INT64_MIN

REF = "#/components/schemas/{name}"
NO_NUL = "^[^\\x00]*$"
JSON_VALUE = "JsonValue"

_SCALARS = [
    Schema(type=OpenAPIType.STRING, pattern=NO_NUL),
    Schema(type=OpenAPIType.INTEGER, minimum=INT64_MIN, maximum=INT64_MAX),
    Schema(type=OpenAPIType.NUMBER),
    Schema(type=OpenAPIType.BOOLEAN),
    Schema(type=OpenAPIType.NULL),
]
_SCALAR = Schema(any_of=_SCALARS)
JSON_VALUE_SCHEMA = Schema(
    title=JSON_VALUE,
    description="Any JSON value with no NUL character and no integer beyond 64 bits (two levels deep).",
    any_of=[
        *_SCALARS,
        Schema(type=OpenAPIType.ARRAY, items=_SCALAR),
        Schema(
            type=OpenAPIType.OBJECT,
            property_names=Schema(pattern=NO_NUL),
            additional_properties=Schema(any_of=[*_SCALARS, Schema(type=OpenAPIType.ARRAY, items=_SCALAR)]),
        ),
    ],
)

# What a body must hold that its fields' own types cannot say, as alternatives of which at least
# one must hold (`anyOf`): a text request needs a prompt unless it carries a chat payload; an
# update names at least one thing to change (a field sent as null changes nothing).
_NOT_NULL = Schema(schema_not=Schema(type=OpenAPIType.NULL))
AT_LEAST: dict[str, list[Schema]] = {
    "TextRequestInput": [
        Schema(required=["prompt"], properties={"prompt": Schema(type=OpenAPIType.STRING, min_length=1)}),
        Schema(required=["chat"], properties={"chat": Schema(type=OpenAPIType.OBJECT)}),
    ],
    **{
        struct: [Schema(required=[f], properties={f: _NOT_NULL}) for f in fields]
        for struct, fields in (
            ("WorkerUpdate", ("maintenance", "maintenance_msg", "paused", "info", "name", "team")),
            (
                "UserUpdate",
                (
                    "kudos",
                    "trusted",
                    "moderator",
                    "username",
                    "contact",
                    "admin_comment",
                    "public_workers",
                    "worker_invited",
                    *USER_LIMIT_FIELDS,
                ),
            ),
            ("ModifyTeamInput", ("name", "info")),
            ("HordeModesInput", ("maintenance_mode", "invite_only_mode", "raid_mode")),
            ("FilterPatch", ("regex", "filter_type", "description", "replacement")),
        )
    },
}

# JSON Schema keywords msgspec writes, as the OpenAPI spec dataclass names them.
_FIELDS = {
    "additionalProperties": "additional_properties", "anyOf": "any_of", "allOf": "all_of",
    "oneOf": "one_of", "prefixItems": "prefix_items", "minItems": "min_items", "maxItems": "max_items",
    "minLength": "min_length", "maxLength": "max_length", "exclusiveMinimum": "exclusive_minimum",
    "exclusiveMaximum": "exclusive_maximum", "multipleOf": "multiple_of", "minProperties": "min_properties",
    "maxProperties": "max_properties", "uniqueItems": "unique_items", "propertyNames": "property_names",
    "not": "schema_not",
}  # fmt: skip
_NESTED = frozenset(
    (
        "properties",
        "additional_properties",
        "property_names",
        "items",
        "prefix_items",
        "any_of",
        "all_of",
        "one_of",
    )
)


def _as_spec(js: dict[str, Any]) -> Schema | Reference:
    """One msgspec JSON Schema (a dict) as the OpenAPI spec's objects, with the raw-input rules."""
    if "$ref" in js:
        return Reference(ref=js["$ref"])
    if not js:  # Any
        return Reference(ref=REF.format(name=JSON_VALUE))
    kwargs: dict[str, Any] = {}
    for key, value in js.items():
        name = _FIELDS.get(key, key)
        if name == "type":
            value = [OpenAPIType(t) for t in value] if isinstance(value, list) else OpenAPIType(value)
        elif name == "discriminator":
            value = Discriminator(property_name=value["propertyName"], mapping=value.get("mapping"))
        elif name == "schema_not":  # `{"not": {}}`: no value at all (a field refused by name)
            value = _as_spec(value) if value else Schema()
        elif name == "properties":
            value = {k: _as_spec(v) for k, v in value.items()}
        elif name in _NESTED and isinstance(value, dict):
            value = _as_spec(value)
        elif name in _NESTED and isinstance(value, list):
            value = [_as_spec(v) for v in value]
        kwargs[name] = value
    schema = Schema(**kwargs)
    if schema.type == OpenAPIType.STRING and schema.pattern is None and schema.enum is None:
        schema.pattern = NO_NUL
    if schema.type == OpenAPIType.INTEGER:
        schema.minimum = INT64_MIN if schema.minimum is None else max(schema.minimum, INT64_MIN)
        schema.maximum = INT64_MAX if schema.maximum is None else min(schema.maximum, INT64_MAX)
    if schema.type == OpenAPIType.OBJECT and schema.additional_properties is None:
        schema.property_names = Schema(pattern=NO_NUL)
        schema.additional_properties = Reference(ref=REF.format(name=JSON_VALUE))
    return schema


def _bodies(app: Litestar) -> list[Any]:
    """The type of every handler's `data`."""
    found = []
    for route in app.routes:
        if isinstance(route, HTTPRoute):
            for handler in route.route_handlers:
                if handler.parsed_data_field is not None and handler.resolve_include_in_schema():
                    found.append(handler.parsed_data_field.annotation)
    return found


def describe_bodies(app: Litestar) -> None:
    """Replace the bodies' components with msgspec's, once, before the schema is first served (or
    written by the CLI's `openapi`)."""
    components = app.openapi_schema.components
    schemas = components.schemas if components.schemas is not None else {}
    if JSON_VALUE in schemas:
        return  # described already
    _, generated = msgspec.json.schema_components(_bodies(app), ref_template=REF)
    for name, js in generated.items():
        schema = _as_spec(js)
        assert isinstance(schema, Schema)
        if name in AT_LEAST:
            schema.any_of = AT_LEAST[name]
        schemas[name] = schema
    schemas[JSON_VALUE] = JSON_VALUE_SCHEMA
    components.schemas = dict(sorted(schemas.items()))
