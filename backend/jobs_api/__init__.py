"""The jobs REST API (``/api/jobs...``): request and response serializers, the views, the flows
behind them (create, join, start, cancel) and the read model, over the protocol engine in
backend/jobs, which never imports this package (docs/ARCHITECTURE.md, section 2)."""
