"""Google APIs' response field masks, as the simulated cloud applies them.

Every Google REST and gRPC API takes the system parameter ``fields`` (``$fields``) or the
``X-Goog-FieldMask`` header: the response holds only the fields it names
(https://cloud.google.com/apis/docs/system-parameters). Syntax: paths separated by commas, a
path's parts by ``.`` or ``/``, sub-fields of one field in parentheses, ``*`` for every field:
``nodePools(name,status,config(labels,machineType)),nextPageToken``. A mask naming a field the
response type does not have is refused (400 INVALID_ARGUMENT), as the real service does.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

# A parsed mask: field name -> its sub-mask, None for the whole field.
Mask = dict[str, "Mask | None"]


class FieldMaskError(ValueError):
    """The mask cannot be parsed, or names a field its response type does not have."""


def parse(text: str) -> Mask | None:
    """The mask `text` names; None for every field (empty or ``*``)."""
    text = text.replace(" ", "")
    if text in ("", "*"):
        return None
    mask, end = _parse_list(text, 0)
    if end != len(text):
        raise FieldMaskError(f"invalid field mask {text!r}: unexpected {text[end]!r} at {end}")
    return mask


def _parse_list(text: str, i: int) -> tuple[Mask, int]:
    mask: Mask = {}
    while True:
        j = i
        while j < len(text) and text[j] not in ",()":
            j += 1
        parts = text[i:j].replace("/", ".").split(".")
        if not all(parts):
            raise FieldMaskError(f"invalid field mask {text!r}: an empty field name at {i}")
        sub: Mask | None = None
        if j < len(text) and text[j] == "(":
            sub, j = _parse_list(text, j + 1)
            if j >= len(text) or text[j] != ")":
                raise FieldMaskError(f"invalid field mask {text!r}: unclosed '(' before {j}")
            j += 1
        _merge(mask, parts, sub)
        if j < len(text) and text[j] == ",":
            i = j + 1
            continue
        return mask, j


def _merge(mask: Mask, parts: list[str], sub: Mask | None) -> None:
    """Add one path (its last part selecting `sub`) to `mask`; a whole field stays whole."""
    head, rest = parts[0], parts[1:]
    tail: Mask | None = sub
    for part in reversed(rest):
        tail = {part: tail}
    if head not in mask:
        mask[head] = tail
    elif mask[head] is not None and tail is not None:
        for key, value in tail.items():
            _merge(mask[head], [key], value)  # type: ignore[arg-type]
    else:
        mask[head] = None


def resolve(mask: Mask | None, descriptor: Descriptor) -> Mask | None:
    """`mask` with every field by its JSON name (a mask may name fields either way); refused
    when it names a field `descriptor`'s message does not have, or sub-fields of a field that has
    none (a scalar, a list of scalars, a map)."""
    if mask is None:
        return None
    resolved: Mask = {}
    for name, sub in mask.items():
        if name == "*":
            resolved[name] = None
            continue
        field = _field(descriptor, name)
        if field is None:
            raise FieldMaskError(
                f"Invalid field mask: field {name!r} not found in {descriptor.full_name}"
            )
        message = field.message_type
        if sub is not None and (message is None or message.GetOptions().map_entry):
            raise FieldMaskError(
                f"Invalid field mask: {descriptor.full_name}.{name} has no sub-fields"
            )
        resolved[field.json_name] = None if sub is None else resolve(sub, message)
    return resolved


def _field(descriptor: Descriptor, name: str) -> FieldDescriptor | None:
    by_name: FieldDescriptor | None = descriptor.fields_by_name.get(name)
    return by_name or descriptor.fields_by_camelcase_name.get(name)


def apply(value: Any, mask: Mask | None) -> Any:
    """`value` (a JSON response) with only the fields `mask` names."""
    if mask is None or "*" in mask:
        return value
    if isinstance(value, list):
        return [apply(item, mask) for item in value]
    if not isinstance(value, dict):
        return value
    return {key: apply(value[key], sub) for key, sub in mask.items() if key in value}
