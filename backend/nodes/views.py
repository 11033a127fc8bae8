"""This node's identity, its peers and the recent chain events (read-only for every role)."""

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.api.permissions import OperatorWrites
from backend.ledger.models import RejectedEvent
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
        """The newest events, mirrored and rejected (newest block first); ``?status=`` picks one kind."""
        query = EventQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        limit, status = query.validated_data["limit"], query.validated_data.get("status")
        mirrored = [] if status == "rejected" else overview.recent_events(limit)
        for event in mirrored:
            event.update(status="mirrored", reason=None)
        rejected = [] if status == "mirrored" else _rejected_events(limit)
        # both lists are newest first: merge on the block (a rejected event first within one)
        events = sorted(rejected + mirrored, key=lambda e: e["block"], reverse=True)[:limit]
        return Response(EventSerializer(events, many=True).data)


def _rejected_events(limit: int) -> list[dict]:
    return [
        {
            "name": event.name,
            "contract": event.contract,
            "block": event.block_number,
            "tx_hash": event.tx_hash,
            "args": {},
            "timestamp": None,
            "status": "rejected",
            "reason": event.reason,
        }
        for event in RejectedEvent.objects.order_by("-block_number", "-log_index")[:limit]
    ]
