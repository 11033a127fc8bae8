"""Job endpoints: thin views over backend.jobs.services (writes) and readmodel (reads)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from drf_spectacular.utils import extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from backend import limits
from backend.api.errors import NotFound
from backend.api.permissions import OperatorWrites
from backend.jobs import readmodel, sealed, services
from backend.jobs.context import current_node
from backend.jobs.models import JobRecord
from backend.jobs.response_serializers import (
    CommitteeRoundSerializer,
    JobCancelledSerializer,
    JobLimitsSerializer,
    JobStartedSerializer,
)
from backend.jobs.serializers import (
    JobCreateSerializer,
    JobSerializer,
    JoinSerializer,
    RoundSerializer,
    StartSerializer,
)
from backend.ledger import models as mirror
from backend.peers.guard import peer_signed
from backend.peers.signing import HEADER_ADDRESS
from backend.swarm.factory import peer_auth

_JOB_SHAPE = "A job as this node sees it on chain: config, status, participants, committee (docs/API.md)."


def _node():
    return current_node()


class JobViewSet(viewsets.ViewSet):
    """Jobs on chain as this node sees them. Operators write; every role reads."""

    permission_classes = [OperatorWrites]
    lookup_value_regex = r"\d+"

    def _job(self, pk) -> mirror.Job:
        job = mirror.Job.objects.filter(job_id=int(pk)).first()
        if job is None:
            raise NotFound(f"no job {pk} on chain (or not indexed yet)")
        return job

    def _payload(self, job: mirror.Job) -> dict:
        record = JobRecord.objects.filter(onchain_id=job.job_id).first()
        return readmodel.job_payload(job, record, _node().address)

    @extend_schema(
        responses={200: JobSerializer(many=True)}, operation_id="jobs_list", description=_JOB_SHAPE
    )
    def list(self, request):
        jobs = mirror.Job.objects.order_by("-job_id")[:500]
        return Response([self._payload(job) for job in jobs])

    @extend_schema(
        responses={200: JobLimitsSerializer},
        description="The bounds of a job's fields (backend.limits), as POST /api/jobs and the contract apply them.",
    )
    @action(detail=False, methods=["get"])
    def limits(self, request):
        return Response(JobLimitsSerializer(limits.as_dict()).data)

    @extend_schema(responses={200: JobSerializer}, description=_JOB_SHAPE)
    def retrieve(self, request, pk=None):
        return Response(self._payload(self._job(pk)))

    @extend_schema(request=JobCreateSerializer, responses={201: JobSerializer})
    def create(self, request):
        form = JobCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        record = services.create_job(_node(), form.validated_data)
        return Response(self._payload(self._job(record.onchain_id)), status=status.HTTP_201_CREATED)

    @extend_schema(request=JoinSerializer, responses={200: JobSerializer})
    @action(detail=True, methods=["post"])
    def join(self, request, pk=None):
        form = JoinSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        services.join_job(_node(), int(pk), form.validated_data["dataset"])
        return Response(self._payload(self._job(pk)))

    @extend_schema(request=StartSerializer, responses={200: JobStartedSerializer})
    @action(detail=True, methods=["post"])
    def start(self, request, pk=None):
        form = StartSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        tx_hash = services.start_job(_node(), int(pk), form.validated_data.get("committee"))
        return Response(self._payload(self._job(pk)) | {"start_tx_hash": tx_hash})

    @extend_schema(request=None, responses={200: JobCancelledSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        tx_hash = services.cancel_job(_node(), int(pk))
        return Response(self._payload(self._job(pk)) | {"cancel_tx_hash": tx_hash})

    @extend_schema(
        responses={200: RoundSerializer(many=True)},
        description="Rounds as the chain's events record them, with this node's privacy releases.",
    )
    @action(detail=True, methods=["get"])
    def rounds(self, request, pk=None):
        return Response(readmodel.rounds_payload(self._job(pk), _node().address))

    @extend_schema(
        responses={200: CommitteeRoundSerializer(many=True)}, description="The committee of each round."
    )
    @action(detail=True, methods=["get"])
    def committee(self, request, pk=None):
        return Response(readmodel.committee_payload(self._job(pk)))


def _update_key(request: HttpRequest, body: memoryview) -> HttpResponse:
    """A sealed update's key, for a participant of its job once the round's training is over.

    Peer API (node-signed, see backend.peers.guard.peer_signed): the signer is checked before the
    body is read, so the address header is the verified signer. 403 for a non-participant, 409
    while the round still trains, 404 when this node holds no key of that update (backend.jobs.sealed).
    """
    job_id, round_, trainer = sealed.parse_request(bytes(body))  # ValueError: 400
    node = _node()
    try:
        key = sealed.answer(node, node.address, request.headers[HEADER_ADDRESS], job_id, round_, trainer)
    except sealed.KeyRefused as exc:
        return JsonResponse({"detail": str(exc)}, status=exc.status)
    return JsonResponse({"key": key})


peer_update_key = peer_signed(_update_key, peer_auth, max_body=sealed.MAX_REQUEST_BYTES)
