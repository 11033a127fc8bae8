"""Admin views of datasets and their privacy records: read-only, and nothing here deletes a budget.

A dataset's privacy records are its audit trail: deleting one (or the dataset it belongs to)
would hand its records a fresh budget, so the admin can neither add, change nor delete them.
"""

from django.contrib import admin

from backend.datasets.models import BudgetGroup, Dataset, Grant, PrivacyRelease


class ReadOnlyBudgetAdmin(admin.ModelAdmin):
    """Shown to staff, never written through the admin."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "format",
        "num_samples",
        "status",
        "onchain_id",
        "budget_group",
        "owner",
        "created",
    )
    list_filter = ("format", "status")
    # The encrypted reference carries the data key: never shown, not even to staff.
    exclude = ("encrypted_reference",)
    readonly_fields = [f.name for f in Dataset._meta.fields if f.name != "encrypted_reference"]

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # its privacy records would go with it


@admin.register(Grant)
class GrantAdmin(admin.ModelAdmin):
    list_display = ("dataset", "grantee", "tx_hash", "created", "revoked")
    readonly_fields = ("dataset", "grantee", "wrapped_key", "tx_hash", "created", "revoked", "revoke_tx_hash")


@admin.register(PrivacyRelease)
class PrivacyReleaseAdmin(ReadOnlyBudgetAdmin):
    list_display = ("dataset", "job", "round", "kind", "status", "epsilon_after", "created")
    list_filter = ("kind", "status")
    readonly_fields = [f.name for f in PrivacyRelease._meta.fields]


@admin.register(BudgetGroup)
class BudgetGroupAdmin(ReadOnlyBudgetAdmin):
    list_display = ("id", "created")
    readonly_fields = ("created",)
