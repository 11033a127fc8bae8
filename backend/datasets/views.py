"""Dataset endpoints: thin views over backend.datasets.services."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import JSONParser, MultiPartParser
from rest_framework.response import Response

from backend.api.pagination import BoundedLimitOffsetPagination
from backend.api.permissions import ProviderWrites
from backend.api.uploads import FORM_OVERHEAD_BYTES, UploadTooLarge
from backend.datasets import services
from backend.datasets.models import Dataset
from backend.datasets.serializers import (
    DatasetSerializer,
    DatasetUploadSerializer,
    GrantRequestSerializer,
    GrantSerializer,
)
from backend.datasets.upload import SizeLimitedMemoryUploadHandler
from backend.identity.roles import Role, role_of


def _content_length(request) -> int:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 0


class OwnDatasetsForProviders(ProviderWrites):
    """A provider changes (grants, revokes) only the datasets it uploaded; the operator any."""

    def has_object_permission(self, request, view, dataset) -> bool:
        if request.method in ("GET", "HEAD", "OPTIONS"):
            return True
        return role_of(request.user) == Role.OPERATOR or dataset.owner_id == request.user.id


class DatasetViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    queryset = Dataset.objects.select_related("owner")
    serializer_class = DatasetSerializer
    permission_classes = [OwnDatasetsForProviders]
    pagination_class = BoundedLimitOffsetPagination
    parser_classes = [MultiPartParser, JSONParser]
    _upload_handler: SizeLimitedMemoryUploadHandler | None = None

    def initialize_request(self, request, *args, **kwargs):
        # Installed before DRF parses the body: uploads stay in memory, bounded by the limit.
        self._upload_handler = SizeLimitedMemoryUploadHandler(request, settings.DEFL_MAX_UPLOAD_BYTES)
        request.upload_handlers = [self._upload_handler]
        return super().initialize_request(request, *args, **kwargs)

    @extend_schema(
        request={"multipart/form-data": DatasetUploadSerializer}, responses={201: DatasetSerializer}
    )
    def create(self, request):
        # A body too large by its Content-Length is a 413 before a byte of it is read: the client
        # learns it at once instead of after sending it all.
        if _content_length(request) > settings.DEFL_MAX_UPLOAD_BYTES + FORM_OVERHEAD_BYTES:
            raise UploadTooLarge(settings.DEFL_MAX_UPLOAD_BYTES)
        form = DatasetUploadSerializer(data=request.data)  # parses the body through the handler
        handler = self._upload_handler
        assert handler is not None  # initialize_request installs it before any action runs
        if handler.too_large:  # a body without a Content-Length that ran past the limit
            raise UploadTooLarge(settings.DEFL_MAX_UPLOAD_BYTES)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        upload = services.Upload(
            name=data["name"],
            format=data["format"],
            data=data["file"].read(),
            epsilon_cap=data["epsilon_cap"],
            delta=data["delta"],
            label_column=data["label_column"],
            classes=data["classes"],
            public_holdout=data["public_holdout"],
            disjoint=data["disjoint"],
        )
        dataset = services.create_dataset(upload, owner=request.user)
        return Response(DatasetSerializer(dataset).data, status=status.HTTP_201_CREATED)

    @extend_schema(methods=["GET"], responses={200: GrantSerializer(many=True)})
    @extend_schema(methods=["POST"], request=GrantRequestSerializer, responses={201: GrantSerializer})
    @action(detail=True, methods=["get", "post"], pagination_class=None)
    def grants(self, request, pk=None):
        dataset = self.get_object()
        if request.method == "GET":
            return Response(GrantSerializer(dataset.grants.all(), many=True).data)
        form = GrantRequestSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        grant = services.grant_access(dataset, form.validated_data["node"])
        return Response(GrantSerializer(grant).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        parameters=[
            OpenApiParameter("node", str, OpenApiParameter.PATH, description="the grantee's address")
        ],
        request=None,
        responses={200: GrantSerializer},
    )
    @action(
        detail=True, methods=["delete"], url_path=r"grants/(?P<node>0x[0-9a-fA-F]{40})", pagination_class=None
    )
    def revoke(self, request, pk=None, node=None):
        # 200 with the revoked grant rather than 204: the caller wants the revocation's tx hash.
        grant = services.revoke_access(self.get_object(), node)
        return Response(GrantSerializer(grant).data)
