"""Model registry and online inference: thin views over backend.serving.services."""

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.throttling import UserRateThrottle

from backend.api.pagination import BoundedLimitOffsetPagination
from backend.api.permissions import AnyRole
from backend.api.schema import errors
from backend.serving import blobs, services
from backend.serving.models import GlobalModel
from backend.serving.serializers import (
    GlobalModelSerializer,
    PredictQuerySerializer,
    PredictRequestSerializer,
    PredictResponseSerializer,
)


class ModelDownloadThrottle(UserRateThrottle):
    """Model downloads per user (or per address for a caller without one)."""

    scope = "model_download"
    rate = "20/min"


class GlobalModelViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = GlobalModel.objects.all()
    serializer_class = GlobalModelSerializer
    pagination_class = BoundedLimitOffsetPagination
    # Every role may read and predict: inference changes nothing stored.
    permission_classes = [AnyRole]

    @extend_schema(
        responses={
            (200, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY, "safetensors bytes"),
            **errors(409, 413, 429, 503),
        }
    )
    @action(detail=True, methods=["get"], throttle_classes=[ModelDownloadThrottle])
    def download(self, request, pk=None):
        # Streamed a piece at a time (a model may be hundreds of megabytes), at most
        # ModelDownloadThrottle's rate per user: a script cannot pin the node's memory or network.
        model = self.get_object()
        size = blobs.model_size(model)
        response = StreamingHttpResponse(
            blobs.stream_model_bytes(model), content_type="application/octet-stream"
        )
        response["Content-Length"] = str(size)
        filename = f"defl-job{model.job}-round{model.round}.safetensors"
        response["Content-Disposition"] = f'attachment; filename="{filename}"'
        return response

    @extend_schema(
        parameters=[PredictQuerySerializer],
        request=PredictRequestSerializer,
        responses=PredictResponseSerializer,
    )
    @action(detail=True, methods=["post"])
    def predict(self, request, pk=None):
        model = self.get_object()
        query = PredictQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        form = PredictRequestSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        if query.validated_data["latest"]:
            model = services.latest_version(model)
        return Response(services.predict(model, form.validated_data["inputs"]))
