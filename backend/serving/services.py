"""Serving flows: registering a global model version (the round driver) and predicting with it."""

from __future__ import annotations

import logging
import math

import numpy as np
import torch
from django.db import transaction
from torch import nn

from backend.api.errors import Conflict, InvalidInput
from backend.serving import blobs
from backend.serving.cache import ModelCache
from backend.serving.models import GlobalModel
from fl_node import codec
from fl_node.models import create_model

logger = logging.getLogger(__name__)

MAX_PREDICT_BATCH = 1024


def build_module(model: GlobalModel, data: bytes) -> nn.Module:
    state, _server_state = codec.decode_model(data)
    module = create_model(
        model.architecture,
        input_shape=tuple(model.input_shape),
        num_classes=model.num_classes,
        **model.options,
    )
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise Conflict(
            f"model {model.pk}'s weights do not fit architecture {model.architecture!r}: {exc}"
        ) from exc
    return module.eval()


def load_module(model: GlobalModel) -> nn.Module:
    return build_module(model, blobs.fetch_model_bytes(model))


model_cache = ModelCache(load_module)


def register_global_model(
    *,
    job: str | int,
    round: int,
    architecture: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    reference: str,
    content_hash: str,
    onchain_hash: str = "",
    options: dict | None = None,
    data: bytes | None = None,
) -> GlobalModel:
    """Record a global model version and make it this process's served version of its job.

    Called by the round driver once the contract fixed the model. ``data`` (the
    safetensors bytes, when the caller has them) saves a fetch: the module is built
    from it, checked against ``content_hash``, and swapped into the cache at once.
    Registering the same (job, round) again returns the existing record.
    """
    if data is not None and codec.content_hash(data) != content_hash:
        raise Conflict("the model bytes do not match the given content hash")
    with transaction.atomic():
        model, created = GlobalModel.objects.get_or_create(
            job=str(job),
            round=round,
            defaults={
                "architecture": architecture,
                "options": options or {},
                "input_shape": list(input_shape),
                "num_classes": num_classes,
                "content_hash": content_hash,
                "onchain_hash": onchain_hash,
                "reference": reference,
            },
        )
    if not created and model.content_hash != content_hash:
        raise Conflict(f"job {job} round {round} is registered with another content hash")
    if data is not None:
        model_cache.put(model, build_module(model, data))
    return model


def latest_version(model: GlobalModel) -> GlobalModel:
    return GlobalModel.objects.filter(job=model.job).order_by("-round").first() or model


def _as_batch(model: GlobalModel, inputs) -> torch.Tensor:
    """Inputs as float32 of shape (n, *input_shape); flat rows of the right length are reshaped."""
    shape = tuple(model.input_shape)
    try:
        array = np.asarray(inputs, dtype=np.float32)
    except (ValueError, TypeError) as exc:
        raise InvalidInput("inputs must be a rectangular array of numbers", field="inputs") from exc
    if array.ndim < 2 or array.shape[0] == 0:
        raise InvalidInput("inputs must be a non-empty list of samples", field="inputs")
    if array.shape[0] > MAX_PREDICT_BATCH:
        raise InvalidInput(f"at most {MAX_PREDICT_BATCH} samples per request", field="inputs")
    if array.shape[1:] != shape:
        if array.ndim == 2 and array.shape[1] == math.prod(shape):
            array = array.reshape((array.shape[0], *shape))
        else:
            raise InvalidInput(
                f"each sample must have shape {list(shape)} (or {math.prod(shape)} values), "
                f"got {list(array.shape[1:])}",
                field="inputs",
            )
    if not np.isfinite(array).all():
        raise InvalidInput("inputs contain NaN or infinite values", field="inputs")
    return torch.from_numpy(array)


def predict(model: GlobalModel, inputs) -> dict:
    batch = _as_batch(model, inputs)
    module = model_cache.get(model)
    with torch.inference_mode():
        probabilities = torch.softmax(module(batch), dim=1)
    return {
        "model": model.pk,
        "predictions": probabilities.argmax(dim=1).tolist(),
        "probabilities": probabilities.tolist(),
    }
