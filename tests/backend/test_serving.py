"""Model registry and inference: list, download, predict with input validation, hot swap."""

from __future__ import annotations

import pytest
import torch

from backend.serving import blobs
from backend.serving.services import model_cache, register_global_model
from fl_node.codec import content_hash, encode_model
from fl_node.models import create_model

pytestmark = pytest.mark.django_db

INPUT_SHAPE = (4,)


def _register(round_: int, seed: int, job: str = "1", preload: bool = True):
    module = create_model("mlp", input_shape=INPUT_SHAPE, num_classes=3, seed=seed, hidden=8)
    data = encode_model({k: v.detach().clone() for k, v in module.state_dict().items()})
    reference = blobs.store_model_bytes(data)
    model = register_global_model(
        job=job,
        round=round_,
        architecture="mlp",
        options={"hidden": 8},
        input_shape=INPUT_SHAPE,
        num_classes=3,
        reference=reference,
        content_hash=content_hash(data),
        onchain_hash="0x" + content_hash(data),
        data=data if preload else None,
    )
    return model, module, data


def _expected(module, inputs):
    with torch.no_grad():
        return torch.softmax(module(torch.tensor(inputs, dtype=torch.float32)), dim=1)


def _assert_close(probabilities, expected):
    torch.testing.assert_close(torch.tensor(probabilities), expected, atol=1e-6, rtol=0)


INPUTS = [[0.1, 0.2, 0.3, 0.4], [1.0, -1.0, 0.5, 0.0]]


def test_predict_with_a_registered_model(viewer):
    model, module, _ = _register(round_=1, seed=1, preload=False)
    response = viewer.post(f"/api/models/{model.pk}/predict", {"inputs": INPUTS}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    expected = _expected(module, INPUTS)
    assert body["model"] == model.pk
    assert body["predictions"] == expected.argmax(dim=1).tolist()
    _assert_close(body["probabilities"], expected)
    assert model_cache.resident("1").model_id == model.pk  # loaded once, now cached


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ([[1.0, 2.0]], "shape [4]"),
        ([[1.0, 2.0, 3.0, "x"]], "numbers"),
        ([[1.0, 2.0], [1.0]], "numbers"),
        ([1.0, 2.0, 3.0, 4.0], "non-empty list of samples"),
        ([], "inputs"),
    ],
)
def test_inputs_that_do_not_fit_the_model_are_400(viewer, inputs, message):
    model, _, _ = _register(round_=1, seed=1)
    response = viewer.post(f"/api/models/{model.pk}/predict", {"inputs": inputs}, format="json")
    assert response.status_code == 400
    assert message in response.json()["detail"]


def test_hot_swap_when_a_newer_version_is_registered(viewer):
    first, first_module, _ = _register(round_=1, seed=1)
    viewer.post(f"/api/models/{first.pk}/predict", {"inputs": INPUTS}, format="json")
    assert model_cache.resident("1").model_id == first.pk

    second, second_module, _ = _register(round_=2, seed=2)
    # The round driver's registration swapped the job's resident model without a request.
    assert model_cache.resident("1").model_id == second.pk
    latest = viewer.post(
        f"/api/models/{first.pk}/predict?latest=true", {"inputs": INPUTS}, format="json"
    ).json()
    assert latest["model"] == second.pk
    _assert_close(latest["probabilities"], _expected(second_module, INPUTS))
    # An explicit old version is still served (from a one-off load) and does not evict the new one.
    old = viewer.post(f"/api/models/{first.pk}/predict", {"inputs": INPUTS}, format="json").json()
    _assert_close(old["probabilities"], _expected(first_module, INPUTS))
    assert model_cache.resident("1").model_id == second.pk


def test_another_process_picks_up_the_new_version_on_its_next_request(viewer):
    first, _, _ = _register(round_=1, seed=1)
    second, _, _ = _register(round_=2, seed=2, preload=False)  # registered elsewhere: not loaded here
    assert model_cache.resident("1").model_id == first.pk
    body = viewer.post(f"/api/models/{first.pk}/predict?latest=1", {"inputs": INPUTS}, format="json").json()
    assert body["model"] == second.pk
    assert model_cache.resident("1").model_id == second.pk


def test_list_detail_and_download(viewer):
    model, _, data = _register(round_=1, seed=3)
    listing = viewer.get("/api/models").json()
    assert listing["count"] == 1
    detail = viewer.get(f"/api/models/{model.pk}").json()
    assert {"id", "job", "round", "content_hash", "onchain_hash", "created"} <= detail.keys()
    response = viewer.get(f"/api/models/{model.pk}/download")
    assert response.status_code == 200
    assert response.streaming  # a piece at a time, never the whole model in the server's memory
    assert b"".join(response.streaming_content) == data
    assert response["Content-Length"] == str(len(data))
    assert "safetensors" in response["Content-Disposition"]


def test_a_download_whose_bytes_do_not_match_the_hash_never_completes(viewer):
    from backend.serving.models import GlobalModel

    model, _, data = _register(round_=1, seed=3)
    GlobalModel.objects.filter(pk=model.pk).update(content_hash="0" * 64)
    response = viewer.get(f"/api/models/{model.pk}/download")
    received = bytearray()
    with pytest.raises(blobs.ModelMismatch):
        for piece in response.streaming_content:
            received += piece
    assert len(received) < len(data)  # the client sees a cut download, never a whole wrong file


def test_model_downloads_are_throttled_per_user(viewer, operator):
    model, _, _ = _register(round_=1, seed=3)
    for _ in range(20):
        assert viewer.get(f"/api/models/{model.pk}/download").status_code == 200
    refused = viewer.get(f"/api/models/{model.pk}/download")
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert operator.get(f"/api/models/{model.pk}/download").status_code == 200  # another user's own rate


def test_registering_the_same_round_with_other_bytes_is_refused():
    from backend.api.errors import Conflict

    _register(round_=1, seed=1)
    with pytest.raises(Conflict):
        _register(round_=1, seed=2)
