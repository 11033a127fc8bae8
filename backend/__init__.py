"""The DeFL node: a Django project with one app per concern (see ../shared/DESIGN.md)."""

from .celery import app as celery_app

__all__ = ["celery_app"]
