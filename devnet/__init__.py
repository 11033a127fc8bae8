"""The development harness: what runs a federation on one machine for the demo, the tests and
the benchmarks. A production node never needs it, and the product (``backend``, ``fl_node``)
never imports it (tests/test_layering.py).

- ``anvil``: a local anvil chain on a free loopback port (``AnvilProcess``, ``free_port``).
- ``consortium``: deterministic development keys and a consortium admitted on a fresh chain.
- ``process``: one node's web server as a process with its own data directory, key and port.
- ``localnet``: a local federation (anvil, the contracts, N nodes with agents and workers),
  driven through ``manage.py`` and the REST API as an operator would.
- ``demo``: ``make demo`` (``python -m devnet.demo``).
"""
