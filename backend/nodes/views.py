"""This node's identity, its peers and the recent chain events (read-only for every role)."""

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.api.permissions import OperatorWrites
from backend.nodes import overview
from backend.nodes.serializers import EventQuerySerializer, EventSerializer, NodeSerializer, PeerSerializer


class NodeView(APIView):
    permission_classes = [OperatorWrites]

    @extend_schema(responses={200: NodeSerializer})
    def get(self, request):
        return Response(NodeSerializer(overview.node_overview()).data)


class PeerListView(APIView):
    permission_classes = [OperatorWrites]

    @extend_schema(responses={200: PeerSerializer(many=True)})
    def get(self, request):
        return Response(PeerSerializer(overview.peers(), many=True).data)


class EventListView(APIView):
    permission_classes = [OperatorWrites]

    @extend_schema(parameters=[EventQuerySerializer], responses={200: EventSerializer(many=True)})
    def get(self, request):
        query = EventQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        return Response(
            EventSerializer(overview.recent_events(query.validated_data["limit"]), many=True).data
        )
