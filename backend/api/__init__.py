"""Shared DRF pieces of the node API: role permissions, the domain-error handler, pagination."""
