"""The API's output serializers build their fields once per class and clone them (``config.api.OutputSerializer``).

Each serializer of every output class gets fields of its own (bound to it),
the same as DRF's ``ModelSerializer`` builds for it. No database needed.
"""

import importlib

import pytest
from rest_framework import serializers

from config.api import OutputSerializer

# The modules that declare output serializers: their classes are found as subclasses once imported.
MODULES = ("approvals.api.serializers", "runs.api.serializers")


def _output_classes() -> list[type]:
    for module in MODULES:
        importlib.import_module(module)
    found, todo = [], [OutputSerializer]
    while todo:
        for subclass in todo.pop().__subclasses__():
            found.append(subclass)
            todo.append(subclass)
    return found


def _shown(fields) -> dict[str, str]:
    """Each field as DRF shows it: its class and the arguments it was made with."""
    return {name: repr(field) for name, field in fields.items()}


def test_the_classes_are_found():
    names = {cls.__name__ for cls in _output_classes()}
    assert {"InterruptSerializer", "InterruptToolCallSerializer", "RunSerializer"} <= names


@pytest.mark.parametrize("serializer_class", _output_classes(), ids=lambda cls: cls.__name__)
def test_each_serializer_gets_fields_of_its_own_as_drf_builds_them(serializer_class):
    first, second = serializer_class(), serializer_class()
    built = serializers.ModelSerializer.get_fields(serializer_class())  # DRF's own, never cached

    assert _shown(first.fields) == _shown(second.fields) == _shown(built)
    for name, field in first.fields.items():
        assert field is not second.fields[name], name
        assert field.parent is first and second.fields[name].parent is second, name
