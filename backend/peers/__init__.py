"""Node-to-node authentication, shared by every peer route (the swarm store's, the jobs' key route).

signing.py signs a request for one receiver and verifies one (signature, freshness, receiver,
membership, replay, body hash); endpoints.py says which peer addresses a node may dial;
receive.py reads a peer request's body without the server's copies; guard.py wraps a peer view
in all the checks (``peer_signed``). The package imports nothing else from the backend: what a
check needs (this node's address, the peer directory, the nonce cache, the limits) is handed in
as a ``PeerAuth`` by the app that serves the route.
"""
