"""Routes whose record ids are bounded: a path names a record by at most 18 digits.

DRF's router matches any text as a lookup and Django's <int:> any number of digits; a number
past a database's 64-bit key then overflows it (a 500). Here a longer or non-numeric id does
not match at all, so the API's last route answers it with a JSON 404.
"""

from __future__ import annotations

from django.urls import register_converter
from rest_framework.routers import SimpleRouter

from backend.api.schema import RECORD_ID_PATTERN


class RecordIdConverter:
    regex = RECORD_ID_PATTERN

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value: int) -> str:
        return str(value)


register_converter(RecordIdConverter, "id")


class RecordRouter(SimpleRouter):
    """A router whose viewsets' lookups are record ids unless the viewset says otherwise."""

    def get_lookup_regex(self, viewset, lookup_prefix=""):
        if getattr(viewset, "lookup_value_regex", None) is None:
            viewset.lookup_value_regex = RECORD_ID_PATTERN
        return super().get_lookup_regex(viewset, lookup_prefix)
