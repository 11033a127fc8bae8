"""Federated jobs, rounds, participations; REST API; the round driver (Celery tasks)."""
