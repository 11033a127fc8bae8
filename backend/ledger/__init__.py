"""The only code that talks to the chain: contract bindings, transaction sending, event indexer.

Plain-Python client (no Django): ``artifacts`` (compiled ABIs), ``abi`` (pure encoding and
decoding), ``errors`` (one exception family), ``client`` (signing, nonces, retries),
``contracts`` (one small class per contract), ``deploy``, ``chains`` and ``anvil``.
Django parts: ``models`` (the mirror of the chain), ``indexer``, ``projections``, ``factory``
(the only place that reads settings) and the ``manage.py ledger`` command.
"""
