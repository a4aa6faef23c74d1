"""Request bodies decoded with msgspec's strict rules, as a Litestar DTO.

Litestar converts a handler's `data` leniently (`"80"` becomes 80, `1` becomes `true`); the horde
API has always refused a field of the wrong type, and clients rely on the 400 naming it. A number
with no fractional part (`80.0`) is an integer, as JSON Schema (and so the OpenAPI schema) counts it. Set on a
router (`dto=StrictBody, return_dto=None`), this DTO decodes every `data: <Struct>` of its handlers
straight from the raw bytes into the annotated type, strictly, and describes the body in the OpenAPI
schema as that type itself. Defaults still apply on the server: a client sends only what it sets.
"""

from __future__ import annotations

import re
from collections.abc import Generator
from typing import Any, TypeVar

import msgspec
from litestar.dto import AbstractDTO, DTOConfig, DTOFieldDefinition
from litestar.exceptions import ValidationException
from litestar.openapi.spec import Reference, Schema
from litestar.typing import FieldDefinition

T = TypeVar("T")

_AT = re.compile(r"^(?P<reason>.*) - at `\$\.?(?P<path>[^`]*)`$", re.DOTALL)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<field>.*)`$", re.DOTALL)


def validation_error(error: msgspec.ValidationError) -> ValidationException:
    """A msgspec validation failure as Litestar's own, naming the field (`params`, `models[0]`; an
    unknown field by its own name, `chat.foo`)."""
    found = _AT.match(str(error))
    reason, path = (found["reason"], found["path"]) if found else (str(error), "")
    if unknown := _UNKNOWN.match(reason):
        path = f"{path}.{unknown['field']}" if path else unknown["field"]
    path = path or "body"
    return ValidationException(
        detail=f"{path}: {reason}", extra=[{"message": reason, "key": path, "source": "body"}]
    )


_INTEGRAL_FLOAT = re.compile(r"Expected `[^`]*\bint\b[^`]*`, got `float`")
_EXACT = 2**53  # past it a float is integral whatever it meant: left a float, refused as one


def _integral(value: Any) -> Any:
    """The decoded body with each float of no fractional part (`1651.0`) as the int it equals."""
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) <= _EXACT else value
    if isinstance(value, list):
        return [_integral(v) for v in value]
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    return value


class StrictBody(AbstractDTO[T]):
    """Decode `data` strictly into its annotation; never used for answers (`return_dto=None`)."""

    config = DTOConfig()

    @classmethod
    def generate_field_definitions(cls, model_type: type[Any]) -> Generator[DTOFieldDefinition, None, None]:
        yield from ()  # no transfer model: the body decodes into the annotated type itself

    @classmethod
    def detect_nested_field(cls, field_definition: FieldDefinition) -> bool:
        return False

    @classmethod
    def create_for_field_definition(
        cls, field_definition: FieldDefinition, handler_id: str, backend_cls: Any = None
    ) -> None:
        return None  # nothing to build per handler

    @classmethod
    def create_openapi_schema(
        cls, field_definition: FieldDefinition, handler_id: str, schema_creator: Any
    ) -> Reference | Schema:
        # `schema_creator` is Litestar's SchemaCreator, whose module is private: typed as Any.
        return schema_creator.for_field_definition(field_definition)

    def decode_bytes(self, value: bytes) -> Any:
        data_field = self.asgi_connection.route_handler.parsed_data_field
        assert data_field is not None  # Litestar calls a data DTO only for handlers that take `data`
        try:
            return msgspec.json.decode(value, type=data_field.annotation)
        except msgspec.ValidationError as e:
            if not _INTEGRAL_FLOAT.search(str(e)):
                raise validation_error(e) from e
        except msgspec.DecodeError as e:
            raise ValidationException(detail=f"The request body is not valid JSON: {e}") from e
        # JSON Schema counts 2.0 as an integer (the schema's promise); msgspec's strict rules do not.
        # Only then, the body is read again with every integral number as an int, still strictly.
        try:
            return msgspec.convert(_integral(msgspec.json.decode(value)), type=data_field.annotation)
        except msgspec.ValidationError as e:
            raise validation_error(e) from e

    def decode_builtins(self, value: dict[str, Any]) -> Any:
        data_field = self.asgi_connection.route_handler.parsed_data_field
        assert data_field is not None
        try:
            return msgspec.convert(value, type=data_field.annotation)
        except msgspec.ValidationError as e:
            raise validation_error(e) from e
