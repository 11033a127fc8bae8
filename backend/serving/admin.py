from django.contrib import admin

from backend.serving.models import GlobalModel


@admin.register(GlobalModel)
class GlobalModelAdmin(admin.ModelAdmin):
    list_display = ("job", "round", "architecture", "content_hash", "created")
    list_filter = ("job",)
    readonly_fields = [f.name for f in GlobalModel._meta.fields]
