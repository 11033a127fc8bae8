"""The one definition of a job, read alike by the node (backend/jobs), the simulator
(fl_node.simulate) and the benchmarks (bench/): plain Python, one module per purpose.

- ``limits``: the bounds of a job and a dataset (the one table; the contracts hold the same numbers);
- ``config``: the job's fields, the values each may take, and its canonical bytes (the on-chain
  configHash is the swarm reference of those bytes);
- ``plan``: the privacy plan each participant derives (and the chain's per-release spend bound);
- ``training``: the model, a round's training settings and seed, the public rows, adaptive work;
- ``scoring``: how an honest committee member scores a round's updates and the base model;
- ``aggregation``: how the accepted updates are combined, and the defenses around it.
"""
