"""Who this node is and who its users are: the node key (key.py) and the users' roles (roles.py).

A leaf: it imports nothing from the rest of the backend, so the ledger (which signs with the
key), the swarm (whose peer requests carry it), the API's permissions (which read roles) and
every app above them can depend on it without a cycle.
"""
