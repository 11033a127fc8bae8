"""The dashboard's own read endpoints under /api/dashboard/ (backend.web.summary computes them).

Every role may read them; they change nothing. Their shapes are documented in docs/API.md
("Dashboard") and in the OpenAPI schema as plain objects.
"""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.api.permissions import OperatorWrites
from backend.web import summary


class _ReadOnly(APIView):
    permission_classes = [OperatorWrites]  # every role reads; there is nothing to write
    http_method_names = ["get", "head", "options"]


class OverviewView(_ReadOnly):
    @extend_schema(
        responses={200: OpenApiTypes.OBJECT},
        description="This node's active jobs (phase, latest accuracy), indexer lag, storage, "
        "replication and warnings.",
    )
    def get(self, request):
        return Response(summary.overview())


class JoinCandidatesView(_ReadOnly):
    @extend_schema(
        responses={200: OpenApiTypes.OBJECT},
        description="Members of the federation and the datasets each may join a job with "
        "(own or granted), with the on-chain privacy budget left.",
    )
    def get(self, request):
        return Response(summary.join_candidates())


class GrantedDatasetsView(_ReadOnly):
    @extend_schema(
        responses={200: OpenApiTypes.OBJECT},
        description="Datasets other nodes granted to this node, with owner and state.",
    )
    def get(self, request):
        return Response(summary.granted_datasets())


class ModelCatalogView(_ReadOnly):
    @extend_schema(
        responses={200: OpenApiTypes.OBJECT},
        description="Global model versions with job name, accuracy on this node and the served marker.",
    )
    def get(self, request):
        return Response(summary.model_catalog())
