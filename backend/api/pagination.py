"""Pagination of the growing lists (datasets, models): limit/offset, bounded."""

from rest_framework.pagination import LimitOffsetPagination


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    default_limit = 50
    # A bound so that one request cannot make the node serialize its whole history.
    max_limit = 500
