from django.contrib import admin

from backend.cluster.models import DeviceSlot, Task, Worker


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = ["name", "host", "state", "last_heartbeat"]


@admin.register(DeviceSlot)
class DeviceSlotAdmin(admin.ModelAdmin):
    list_display = ["worker", "kind", "index", "capacity", "used", "running"]


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    list_display = ["job_id", "round", "kind", "state", "priority", "attempts", "worker"]
    list_filter = ["state", "kind"]
