"""Job endpoints: thin views over services (writes) and readmodel (reads), and the peer route of a
sealed update's key (backend/jobs/sealed/key_release.py decides)."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from drf_spectacular.utils import extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from backend.api.errors import NotFound
from backend.api.permissions import OperatorWrites
from backend.api.schema import RECORD_ID_PATTERN, errors
from backend.jobs.context import current_node
from backend.jobs.models import JobRecord
from backend.jobs.sealed import key_release
from backend.jobs_api import readmodel, services
from backend.jobs_api.response_serializers import (
    CommitteeRoundSerializer,
    JobCancelledSerializer,
    JobLimitsSerializer,
    JobStartedSerializer,
)
from backend.jobs_api.serializers import (
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
from fl_node.job import limits


def job_limits() -> dict:
    """The job fields' bounds, and the upload size a dataset may have (the upload form reads both)."""
    return {**limits.as_dict(), "max_upload_bytes": settings.DEFL_MAX_UPLOAD_BYTES}


_JOB_SHAPE = "A job as this node sees it on chain: config, status, participants, committee (docs/API.md)."


def _node():
    return current_node()


class JobViewSet(viewsets.ViewSet):
    """Jobs on chain as this node sees them. Operators write; every role reads."""

    permission_classes = [OperatorWrites]
    lookup_value_regex = RECORD_ID_PATTERN  # an on-chain job id of at most 18 digits

    def _job(self, pk) -> mirror.Job:
        job = mirror.Job.objects.filter(job_id=int(pk)).first()
        if job is None:
            raise NotFound(f"no job {pk} on chain (or not indexed yet)")
        return job

    def _payload(self, job: mirror.Job, *, with_gas: bool = True) -> dict:
        record = JobRecord.objects.filter(onchain_id=job.job_id).first()
        node = _node()
        return readmodel.job_payload(job, record, node.address, ledger=node.ledger, with_gas=with_gas)

    @extend_schema(
        responses={200: JobSerializer(many=True)}, operation_id="jobs_list", description=_JOB_SHAPE
    )
    def list(self, request):
        jobs = mirror.Job.objects.order_by("-job_id")[:500]
        rows = [self._payload(job, with_gas=False) for job in jobs]  # receipts on the job's own page only
        return Response(JobSerializer(rows, many=True).data)

    @extend_schema(
        responses={200: JobLimitsSerializer},
        description="The bounds of a job's fields (fl_node.job.limits), as POST /api/jobs and the contract apply them.",
    )
    @action(detail=False, methods=["get"])
    def limits(self, request):
        return Response(JobLimitsSerializer(job_limits()).data)

    @extend_schema(responses={200: JobSerializer}, description=_JOB_SHAPE)
    def retrieve(self, request, pk=None):
        return Response(JobSerializer(self._payload(self._job(pk))).data)

    @extend_schema(
        request=JobCreateSerializer,
        responses={201: JobSerializer, **errors(409, 503)},
        description="Propose a job and put it on chain. 400: the request alone is invalid (the schema "
        "states every rule). 409: this node's state refuses it, before anything is stored: the "
        "dataset is missing, off chain, too small for delta (at most 1/(10 n)) or without budget for "
        "every round; the model cannot be built for its shape; the nodes' limits; the deployment's "
        "committee rule; fewer members can join than committee_size + min_trainers. errors names the field.",
    )
    def create(self, request):
        form = JobCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        record = services.create_job(_node(), form.validated_data)
        body = JobSerializer(self._payload(self._job(record.onchain_id))).data
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(
        request=JoinSerializer,
        responses={200: JobSerializer, **errors(409, 503)},
        description="Join with this node's dataset (409: not open, joined already, another schema, delta "
        "above 1/(10 n), the budget would be passed).",
    )
    @action(detail=True, methods=["post"])
    def join(self, request, pk=None):
        form = JoinSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        services.join_job(_node(), int(pk), form.validated_data["dataset"])
        return Response(JobSerializer(self._payload(self._job(pk))).data)

    @extend_schema(
        request=StartSerializer,
        responses={200: JobStartedSerializer, **errors(409, 503)},
        description="Start the job (proposer only; 409 unless it is open with committee_size + min_trainers "
        "participants). The contract draws the first committee: a committee field is a 400.",
    )
    @action(detail=True, methods=["post"])
    def start(self, request, pk=None):
        form = StartSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        tx_hash = services.start_job(_node(), int(pk), form.validated_data.get("committee"))
        return Response(JobStartedSerializer(self._payload(self._job(pk)) | {"start_tx_hash": tx_hash}).data)

    @extend_schema(
        request=None,
        responses={200: JobCancelledSerializer, **errors(409, 503)},
        description="Cancel the job (proposer only; 409 when it ended already).",
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        tx_hash = services.cancel_job(_node(), int(pk))
        return Response(
            JobCancelledSerializer(self._payload(self._job(pk)) | {"cancel_tx_hash": tx_hash}).data
        )

    @extend_schema(
        responses={200: RoundSerializer(many=True)},
        description="Rounds as the chain's events record them, each decision with its reason (every update's "
        "scores, the base model's median, the margin, accepted or why not), each transaction's gas, and "
        "this node's privacy releases.",
    )
    @action(detail=True, methods=["get"])
    def rounds(self, request, pk=None):
        job = self._job(pk)
        return Response(RoundSerializer(readmodel.rounds_payload(job, _node()), many=True).data)

    @extend_schema(
        responses={200: CommitteeRoundSerializer(many=True)}, description="The committee of each round."
    )
    @action(detail=True, methods=["get"])
    def committee(self, request, pk=None):
        return Response(CommitteeRoundSerializer(readmodel.committee_payload(self._job(pk)), many=True).data)


def _update_key(request: HttpRequest, body: memoryview) -> HttpResponse:
    """A sealed update's key, for a participant of its job once the round's training is over.

    Peer API (node-signed, see backend.peers.guard.peer_signed): the signer is checked before the
    body is read, so the address header is the verified signer. 403 for a non-participant, 409
    while the round still trains, 404 when this node holds no key of that update (backend.jobs.sealed.key_release).
    """
    job_id, round_, trainer = key_release.parse_request(bytes(body))  # ValueError: 400
    node = _node()
    try:
        key = key_release.answer(node, node.address, request.headers[HEADER_ADDRESS], job_id, round_, trainer)
    except key_release.KeyRefused as exc:
        return JsonResponse({"detail": str(exc)}, status=exc.status)
    return JsonResponse({"key": key})


peer_update_key = peer_signed(_update_key, peer_auth, max_body=key_release.MAX_REQUEST_BYTES)
