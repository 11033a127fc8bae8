"""Model registry and the inference endpoint."""
