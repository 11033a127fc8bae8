"""Pagination of the growing lists (datasets, models): limit/offset, bounded and checked.

DRF's paginator takes a bad ``limit`` or ``offset`` (``null``, ``-3``, ``10**40``) as its default
and clips a large limit; here each is a 400 naming the parameter, as the schema says.
"""

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination

MAX_OFFSET = 10**9  # beyond any list a node keeps; bounded so the database never sees a huge int


def _bounded_int(raw: str, name: str, minimum: int, maximum: int) -> int:
    text = raw
    if not text.isascii() or not text.isdigit() or len(text) > 12 or not minimum <= int(text) <= maximum:
        raise ValidationError({name: [f"must be an integer from {minimum} to {maximum}"]})
    return int(text)


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    default_limit = 50
    # A bound so that one request cannot make the node serialize its whole history.
    max_limit = 500

    def get_limit(self, request):
        raw = request.query_params.get(self.limit_query_param)
        if raw is None:
            return self.default_limit
        return _bounded_int(raw, self.limit_query_param, 1, self.max_limit)

    def get_offset(self, request):
        raw = request.query_params.get(self.offset_query_param)
        if raw is None:
            return 0
        return _bounded_int(raw, self.offset_query_param, 0, MAX_OFFSET)

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        bounds = {self.limit_query_param: (1, self.max_limit), self.offset_query_param: (0, MAX_OFFSET)}
        for parameter in parameters:
            low, high = bounds[parameter["name"]]
            parameter["schema"] = {"type": "integer", "minimum": low, "maximum": high}
        return parameters
