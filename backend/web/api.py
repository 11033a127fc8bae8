"""The dashboard's own read endpoints under /api/dashboard/ (backend.web.summary computes them).

Every role may read them; they change nothing. Their shapes are documented in docs/API.md
("Dashboard") and in the OpenAPI schema (backend.web.serializers), and every answer passes
through those serializers, so the two cannot drift.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.api.permissions import OperatorWrites
from backend.web import summary
from backend.web.serializers import (
    CatalogModelSerializer,
    GrantedDatasetSerializer,
    JoinCandidatesSerializer,
    OverviewSerializer,
)


class _ReadOnly(APIView):
    permission_classes = [OperatorWrites]  # every role reads; there is nothing to write
    http_method_names = ["get", "head", "options"]


class OverviewView(_ReadOnly):
    @extend_schema(
        responses={200: OverviewSerializer},
        description="This node's active jobs (phase, latest accuracy), indexer lag, storage, "
        "replication and warnings.",
    )
    def get(self, request):
        return Response(OverviewSerializer(summary.overview()).data)


class JoinCandidatesView(_ReadOnly):
    @extend_schema(
        responses={200: JoinCandidatesSerializer},
        description="Members of the federation and the datasets each may join a job with "
        "(own or granted), with the on-chain privacy budget left, and whether the deployment "
        "takes small committees.",
    )
    def get(self, request):
        return Response(JoinCandidatesSerializer(summary.join_candidates()).data)


class GrantedDatasetsView(_ReadOnly):
    @extend_schema(
        responses={200: GrantedDatasetSerializer(many=True)},
        description="Datasets other nodes granted to this node, with owner and state.",
    )
    def get(self, request):
        return Response(GrantedDatasetSerializer(summary.granted_datasets(), many=True).data)


class ModelCatalogView(_ReadOnly):
    @extend_schema(
        responses={200: CatalogModelSerializer(many=True)},
        description="Global model versions with job name, accuracy on this node and the served marker.",
    )
    def get(self, request):
        return Response(CatalogModelSerializer(summary.model_catalog(), many=True).data)
