"""CheckResult and PolicyState, C records (csrc/results.c), against frozen dataclasses.

The reference is what the two classes were before they moved to C: frozen
dataclasses of the same fields (built here from moderato.results' field
table). For any field values both must construct, compare, hash, print,
pickle, copy, replace and refuse assignment alike; check_result() must build
records indistinguishable from ones the constructor builds, every defaulted
field included.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import pickle
import weakref
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import moderato._accel as accel
from moderato import results
from moderato.results import CheckResult, PolicyState

REFERENCE_POLICY_STATE = dataclasses.make_dataclass(
    "PolicyState", results._POLICY_STATE_FIELDS, frozen=True
)
REFERENCE_CHECK_RESULT = dataclasses.make_dataclass(
    "CheckResult", results._CHECK_RESULT_FIELDS, frozen=True
)
PAIRS = ((PolicyState, REFERENCE_POLICY_STATE), (CheckResult, REFERENCE_CHECK_RESULT))

VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.tuples(st.integers()),
)


def field_names(cls: Any) -> list[str]:
    return [field.name for field in dataclasses.fields(cls)]


def values_of(record: Any) -> list[Any]:
    return [getattr(record, name) for name in field_names(record)]


@st.composite
def arguments(draw: st.DrawFn, reference: Any) -> tuple[list[Any], dict[str, Any]]:
    """Every required field and some defaulted ones, split between positions and keywords."""
    fields = dataclasses.fields(reference)
    required = [f for f in fields if f.default is dataclasses.MISSING]
    count = draw(st.integers(len(required), len(fields)))
    values = [draw(VALUES) for _ in range(count)]
    positional = draw(st.integers(0, count))
    keywords = {fields[i].name: values[i] for i in range(positional, count)}
    return values[:positional], keywords


def test_the_field_tables_agree() -> None:
    for record, reference in PAIRS:
        assert record.__match_args__ == tuple(field_names(reference))  # type: ignore[attr-defined]
        assert field_names(record) == field_names(reference)
        assert dataclasses.is_dataclass(record)


def test_a_table_that_disagrees_with_the_c_type_refuses_to_import() -> None:
    with pytest.raises(ImportError, match="rebuild the extension"):
        results._attach_dataclass_fields(PolicyState, results._POLICY_STATE_FIELDS[:-1])
    extra = [*results._CHECK_RESULT_FIELDS, ("new_field", int, dataclasses.field(default=0))]
    with pytest.raises(ImportError, match="new_field"):
        results._attach_dataclass_fields(CheckResult, extra)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_records_behave_as_the_frozen_dataclasses(data: st.DataObject) -> None:
    record_cls, reference_cls = data.draw(st.sampled_from(PAIRS))
    args, kwargs = data.draw(arguments(reference_cls))
    record, reference = record_cls(*args, **kwargs), reference_cls(*args, **kwargs)
    assert values_of(record) == values_of(reference)
    assert repr(record) == repr(reference)
    assert hash(record) == hash(reference)
    assert dataclasses.asdict(record) == dataclasses.asdict(reference)
    assert dataclasses.astuple(record) == dataclasses.astuple(reference)
    twin = record_cls(*values_of(record))
    assert (record == twin) is True and (record != twin) is False
    assert record != reference  # another class: never equal, as between dataclasses
    assert (record == values_of(record)) is False
    for clone in (pickle.loads(pickle.dumps(record)), copy.copy(record), copy.deepcopy(record)):
        assert type(clone) is record_cls and clone == record
    name = data.draw(st.sampled_from(field_names(record)))
    changed = data.draw(VALUES)
    replaced = dataclasses.replace(record, **{name: changed})
    assert type(replaced) is record_cls
    assert [getattr(replaced, n) is (changed if n == name else getattr(record, n))
            for n in field_names(record)] == [True] * len(field_names(record))  # fmt: skip
    for target in (name, "not_a_field"):
        with pytest.raises(dataclasses.FrozenInstanceError, match=f"assign to field '{target}'"):
            setattr(record, target, 1)
        with pytest.raises(dataclasses.FrozenInstanceError, match=f"delete field '{target}'"):
            delattr(record, target)
    assert values_of(record) == values_of(reference)


@pytest.mark.parametrize(("record_cls", "reference_cls"), PAIRS)
def test_constructor_errors_match_the_dataclasses(record_cls: Any, reference_cls: Any) -> None:
    count = len(field_names(reference_cls))
    for args, kwargs in (
        ((), {}),
        ((1,) * (count + 1), {}),
        ((1,) * count, {"unknown": 1}),
        ((1,), {field_names(reference_cls)[0]: 1}),
        ((), {"limit": 1}),
    ):
        with pytest.raises(TypeError):
            reference_cls(*args, **kwargs)
        with pytest.raises(TypeError):
            record_cls(*args, **kwargs)


def test_check_result_properties() -> None:
    admitted = CheckResult(True, 10, 9, 0, 1.5, 1, "10/second", "gcra")
    denied = dataclasses.replace(admitted, allowed=False, retry_after=3)
    permanent = dataclasses.replace(admitted, allowed=False, retry_after=None)
    assert (admitted.permanent, admitted.status_code) == (False, 200)
    assert (denied.permanent, denied.status_code) == (False, 429)
    assert (permanent.permanent, permanent.status_code) == (True, 422)
    assert admitted.policies == () and admitted.bypassed is False
    assert admitted.shadow_denied is False


def test_check_result_builds_what_the_constructor_builds_defaults_included() -> None:
    """No field can be left unset: a C-built result equals, field by field, the
    one the constructor builds from the same values, defaults included."""
    plan = (CheckResult, PolicyState, "10/second;100/minute", "gcra", ((10, 1), (100, 60)))
    built = accel.check_result([0, 1, 0, 1, 1001, 500, 59001, 60001], plan)
    states = (PolicyState(10, 1, 0, 1, 1.001), PolicyState(100, 60, 0, 60, 60.001))
    expected = REFERENCE_CHECK_RESULT(False, 100, 0, 60, 60.001, 60, plan[2], "gcra", states)
    assert [(f.name, getattr(built, f.name)) for f in dataclasses.fields(CheckResult)] == [
        (f.name, getattr(expected, f.name)) for f in dataclasses.fields(expected)
    ]


def test_cycles_through_a_record_are_collected() -> None:
    class Holder:
        record: Any = None

    holder = Holder()
    record = CheckResult(True, 1, 1, 0, 1.0, 1, "r", "a", (holder,))
    holder.record = record
    alive = weakref.ref(holder)
    del holder, record
    gc.collect()
    assert alive() is None


def test_the_types_cannot_be_subclassed() -> None:
    # Their layout is fixed: a subclass could not keep the fields' one door.
    for record_cls in (CheckResult, PolicyState):
        with pytest.raises(TypeError):
            type("Sub", (record_cls,), {})
