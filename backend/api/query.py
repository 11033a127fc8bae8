"""Query parameters read strictly: a bad value is a 400 naming the parameter, never ignored.

DRF reads a query string like a form: ``?status=`` counts as "not given", and the paginator
takes ``?offset=null`` as 0. An API client that sends those has a bug it should hear about,
and the schema (a string from a list, an integer from 0) says they are invalid.
"""

from __future__ import annotations

from rest_framework import serializers

EMPTY = "must not be empty: give a value or leave the parameter out"


class QuerySerializer(serializers.Serializer):
    """Base of the serializers of query strings: a parameter present but empty is an error."""

    def to_internal_value(self, data):
        empty: dict[str, list[str]] = {
            str(name): [EMPTY] for name in self.fields if hasattr(data, "get") and data.get(name) == ""
        }
        if empty:
            raise serializers.ValidationError(empty)
        return super().to_internal_value(data)
