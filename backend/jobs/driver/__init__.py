"""The decentralized round driver: this node's part in each round, derived from the chain's events.

``planner`` says which actions are due for this node (pure, from the mirrored state);
``trainer``, ``committee``, ``aggregator`` and ``registrar`` carry them out; ``actions``
claims and runs one action; ``agent`` is the loop (index, plan, dispatch).
"""
