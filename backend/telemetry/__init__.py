"""What a node's processes record as they run, for operators: metric counters and structured logs.

A low layer with no app below it but identity, so the ledger's and the swarm's factories hand its
counters to their clients and the settings take its logging configuration; the scrape and the
health checks that read the whole node are backend/monitoring.
"""
