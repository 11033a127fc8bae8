"""/api/schema/ as a person and a client want it (apart from backend.api.schema, which drf-spectacular's
views import to build their schema class: the view here imports those views)."""

from __future__ import annotations

from drf_spectacular.renderers import OpenApiJsonRenderer, OpenApiJsonRenderer2, OpenApiYamlRenderer
from drf_spectacular.utils import extend_schema
from drf_spectacular.views import SpectacularAPIView


class NodeSchemaView(SpectacularAPIView):
    """/api/schema/: JSON by default (application/json, which a browser shows instead of
    downloading), YAML with ``?format=yaml``; the schema view itself is not an operation of the API."""

    renderer_classes = [OpenApiJsonRenderer2, OpenApiJsonRenderer, OpenApiYamlRenderer]

    @extend_schema(exclude=True)
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)
