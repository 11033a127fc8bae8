"""Operating a node: Prometheus metrics, liveness and readiness, structured logs (docs/OPERATIONS.md)."""
