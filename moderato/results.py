"""What a decision tells the caller: ``CheckResult`` and ``PolicyState``.

Both are immutable records implemented in C (csrc/results.c) and owned by the
accelerator module, so that a check builds its result without any Python
code: ``_accel.check_result`` and a Python call such as
``CheckResult(True, ...)`` go through the same constructor, and a field the
caller leaves out takes its default. They behave as frozen dataclasses: the
fields below, equality and hash over the fields, a repr naming every field,
``dataclasses.FrozenInstanceError`` on assignment, and (through the field
table attached here) ``dataclasses.replace``, ``fields`` and ``asdict``.
"""

from __future__ import annotations

from dataclasses import field, make_dataclass
from typing import Any, Optional

from ._accel import CheckResult, PolicyState

__all__ = ["CheckResult", "PolicyState"]

# Every field's type, and its default where it has one, in CheckResult's order: a
# PolicyState's fields are also CheckResult's, each typed once here.
_FIELD_TYPES: dict[str, Any] = {
    "allowed": bool,
    "limit": int,
    "remaining": Optional[int],
    "retry_after": Optional[int],
    "reset_at": Optional[float],
    "window_seconds": int,
    "rate": str,
    "algorithm": str,
    "policies": tuple,
    "bypassed": bool,
    "shadow_denied": bool,
    "refill": Optional[int],
}
_FIELD_DEFAULTS: dict[str, Any] = {
    "policies": (),
    "bypassed": False,
    "shadow_denied": False,
    "refill": None,
}


def _field_table(*names: str) -> list[Any]:
    """make_dataclass's fields, in this order, with their types and defaults."""
    return [
        (name, _FIELD_TYPES[name], field(default=_FIELD_DEFAULTS[name]))
        if name in _FIELD_DEFAULTS
        else (name, _FIELD_TYPES[name])
        for name in names
    ]


# The fields in order: csrc/results.c holds the same tables (tests/unit/test_accel.py
# checks the two agree).
_POLICY_STATE_FIELDS = _field_table(
    "limit", "window_seconds", "remaining", "retry_after", "reset_at", "refill"
)
_CHECK_RESULT_FIELDS = _field_table(*_FIELD_TYPES)  # every field, in the order above


def _attach_dataclass_fields(record: type, fields: list[Any]) -> None:
    # dataclasses.replace/fields/asdict read the class's field table; a frozen
    # dataclass of the same fields lends it one (the C type keeps its own
    # constructor, equality, hash and repr).
    names = tuple(spec[0] for spec in fields)
    if names != record.__match_args__:  # type: ignore[attr-defined]
        raise ImportError(
            f"moderato._accel.{record.__name__} has the fields "
            f"{record.__match_args__} but moderato.results expects {names}: "  # type: ignore[attr-defined]
            "rebuild the extension"
        )
    table = make_dataclass(record.__name__, fields, frozen=True)
    record.__dataclass_fields__ = table.__dataclass_fields__  # type: ignore[attr-defined]
    record.__dataclass_params__ = table.__dataclass_params__  # type: ignore[attr-defined]


_attach_dataclass_fields(PolicyState, _POLICY_STATE_FIELDS)
_attach_dataclass_fields(CheckResult, _CHECK_RESULT_FIELDS)
