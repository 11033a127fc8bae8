from django.contrib import admin

from backend.datasets.models import BudgetSpend, Dataset, Grant


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ("name", "format", "num_samples", "status", "onchain_id", "owner", "created")
    list_filter = ("format", "status")
    # The encrypted reference carries the data key: never shown, not even to staff.
    exclude = ("encrypted_reference",)
    readonly_fields = [f.name for f in Dataset._meta.fields if f.name != "encrypted_reference"]


@admin.register(Grant)
class GrantAdmin(admin.ModelAdmin):
    list_display = ("dataset", "grantee", "tx_hash", "created", "revoked")
    readonly_fields = ("dataset", "grantee", "wrapped_key", "tx_hash", "created", "revoked", "revoke_tx_hash")


@admin.register(BudgetSpend)
class BudgetSpendAdmin(admin.ModelAdmin):
    list_display = ("dataset", "job", "updated")
    readonly_fields = ("dataset", "job", "history", "updated")
