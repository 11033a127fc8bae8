"""The admin shows privacy records but cannot delete, change or add them (nor delete their dataset)."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.test import Client

from backend.datasets import budget
from backend.datasets.models import BudgetGroup, Dataset, PrivacyRelease
from fl_node.privacy import ReleasePlan
from tests.builders import stored_dataset

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff() -> Client:
    user = get_user_model().objects.create_superuser("root", "root@example.test", "correct horse battery")
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def release() -> PrivacyRelease:
    dataset = stored_dataset("audited", content="2", num_samples=100, epsilon_cap=10.0, delta=1e-4)
    budget.reserve_release(dataset, 1, 1, ReleasePlan("dp_sgd", 1.0, 0.1, 10))
    return PrivacyRelease.objects.get()


@pytest.mark.parametrize("model", [PrivacyRelease, BudgetGroup, Dataset])
def test_no_admin_may_delete_budget_rows(model, release, rf):
    request = rf.get("/admin/")
    request.user = get_user_model().objects.create_superuser("su", "su@example.test", "x")
    model_admin = admin.site._registry[model]
    assert model_admin.has_delete_permission(request) is False
    assert model_admin.has_delete_permission(request, model.objects.first()) is False
    assert "delete_selected" not in model_admin.get_actions(request)


def test_the_delete_views_refuse_and_the_records_stay(staff, release):
    for url in (
        f"/admin/datasets/privacyrelease/{release.pk}/delete/",
        f"/admin/datasets/dataset/{release.dataset_id}/delete/",
        f"/admin/datasets/budgetgroup/{release.dataset.budget_group_id}/delete/",
    ):
        assert staff.get(url).status_code == 403
        assert staff.post(url, {"post": "yes"}).status_code == 403
    changelist = "/admin/datasets/privacyrelease/"
    response = staff.post(
        changelist, {"action": "delete_selected", "_selected_action": [release.pk], "post": "yes"}
    )
    assert response.status_code in (200, 302)
    assert PrivacyRelease.objects.filter(pk=release.pk).exists()
    assert Dataset.objects.filter(pk=release.dataset_id).exists()


def test_the_records_are_shown_read_only(staff, release):
    assert staff.get("/admin/datasets/privacyrelease/").status_code == 200
    page = staff.get(f"/admin/datasets/privacyrelease/{release.pk}/change/")
    assert page.status_code == 200
    assert b'name="noise_multiplier"' not in page.content  # no input: every field is read-only
    assert (
        staff.post(f"/admin/datasets/privacyrelease/{release.pk}/change/", {"status": "withheld"}).status_code
        == 403
    )
    assert PrivacyRelease.objects.get(pk=release.pk).status == "reserved"
    assert staff.get("/admin/datasets/privacyrelease/add/").status_code == 403
