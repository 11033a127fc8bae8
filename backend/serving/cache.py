"""A per-process cache of loaded torch models, one resident version per job.

Loading a model (fetch, verify, decode, build) takes far longer than a prediction,
so each process keeps the newest version it has loaded for every job. When a newer
version of a job is loaded, by ``register_global_model`` in this process or by the
first request that asks for it in another, it replaces the older one: requests in
flight keep the module object they already hold, new ones get the new version. A
request for an older version is answered from a module loaded for that request
only, so it can never evict the job's newest version.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn


@dataclass(frozen=True)
class LoadedModel:
    model_id: int
    round: int
    module: nn.Module


class ModelCache:
    def __init__(self, loader: Callable[[Any], nn.Module]):  # a GlobalModel row -> its module
        self._loader = loader
        self._lock = threading.Lock()
        self._by_job: dict[str, LoadedModel] = {}
        # One lock per model id, so that concurrent first requests load a model once.
        self._loading: dict[int, threading.Lock] = {}

    def get(self, model) -> nn.Module:
        with self._lock:
            resident = self._by_job.get(model.job)
            if resident is not None and resident.model_id == model.pk:
                return resident.module
            if resident is not None and resident.round > model.round:
                older = True
            else:
                older = False
                load_lock = self._loading.setdefault(model.pk, threading.Lock())
        if older:
            return self._loader(model)
        with load_lock:
            with self._lock:  # another thread may have loaded it while we waited
                resident = self._by_job.get(model.job)
                if resident is not None and resident.model_id == model.pk:
                    return resident.module
            module = self._loader(model)
            self.put(model, module)
            return module

    def put(self, model, module: nn.Module) -> None:
        """Make ``module`` the job's resident version unless a newer round is resident."""
        with self._lock:
            resident = self._by_job.get(model.job)
            if resident is None or resident.round <= model.round:
                self._by_job[model.job] = LoadedModel(model.pk, model.round, module)
            self._loading.pop(model.pk, None)

    def resident(self, job: str) -> LoadedModel | None:
        with self._lock:
            return self._by_job.get(job)

    def clear(self) -> None:
        with self._lock:
            self._by_job.clear()
            self._loading.clear()
