"""Celery application. With no broker configured, tasks run in-process (eager)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backend.settings")

app = Celery("defl")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Every worker also consumes a queue of its own (named after its node name, e.g. w2@host), so the
# agent can send a round's training to the worker that backend.cluster placed it on.
app.conf.worker_direct = True
app.autodiscover_tasks()
