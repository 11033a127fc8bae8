"""HTTP endpoints: the signed peer API between nodes and the user API.

Peer endpoints are plain Django views over binary bodies (no DRF parsing or sessions on
the data path); each sits behind ``backend.peers.guard.peer_signed``, which verifies the request
signature first. User endpoints are DRF
views with the project's authentication; swarm errors reach the project's exception
handler (backend/api/exception_handler.py), which maps the SwarmError family to HTTP.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO, cast

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.parsers import FileUploadParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.api.permissions import OperatorWrites
from backend.api.schema import errors
from backend.api.uploads import BoundedMemoryUploadHandler
from backend.peers.guard import peer_signed
from backend.swarm import factory
from backend.swarm.client import MAX_HAS_ADDRESSES
from backend.swarm.download import NetworkSource
from backend.swarm.errors import BlobTooLarge, InvalidReference
from backend.swarm.joiner import blob_span
from backend.swarm.reference import ADDRESS_SIZE, MAX_CHUNK_BYTES, Reference
from backend.swarm.wire import (
    batch_digest,
    decode_addresses,
    decode_batch,
    encode_address_lists,
    encode_addresses,
    encode_batch,
)

# --- peer API ------------------------------------------------------------------------------
# Addresses one request may name: a fetch answers with up to that many chunks (64 MiB), a
# scrub re-reads that many from disk; ``has`` only looks them up.
MAX_FETCH_ADDRESSES = 64
MAX_VERIFY_ADDRESSES = 256


def _addresses(body: memoryview, limit: int) -> list[bytes]:
    addresses = decode_addresses(body)
    if len(addresses) > limit:
        raise ValueError(f"at most {limit} addresses a request")
    return addresses


def _push(request: HttpRequest, body: memoryview) -> HttpResponse:
    """Store a batch of chunks; answer with the addresses now held (bad chunks are left out).

    The store hashes every chunk against its address before writing it (verify=True):
    the signature covers only the addresses (see backend/peers/signing.py). A chunk larger than any
    chunk of a blob may be is left out too (the joiner would refuse it anyway): a peer
    cannot park arbitrary blobs in this node's store.
    """
    chunks = [(a, d) for a, d in decode_batch(body) if len(d) <= MAX_CHUNK_BYTES]
    held = factory.local_store().put_many(chunks, verify=True)
    return HttpResponse(encode_addresses(held), content_type="application/octet-stream")


peer_push = peer_signed(_push, factory.peer_auth, digest=batch_digest)


def _fetch(request: HttpRequest, body: memoryview) -> HttpResponse:
    """Return the asked chunks this node holds (verified on read; corrupt copies are left out)."""
    transport = factory.local_transport()
    found = transport.fetch(_addresses(body, MAX_FETCH_ADDRESSES))
    return HttpResponse(encode_batch(found.items()), content_type="application/octet-stream")


def _has(request: HttpRequest, body: memoryview) -> HttpResponse:
    held = factory.local_store().has_many(_addresses(body, MAX_HAS_ADDRESSES))
    return HttpResponse(encode_addresses(held), content_type="application/octet-stream")


def _verify(request: HttpRequest, body: memoryview) -> HttpResponse:
    """Scrub the asked copies (re-read, re-hash); answer with the good and the corrupt ones.

    Corrupt copies are quarantined, so the asking node (repairing) pushes good ones back.
    """
    good, corrupt = factory.local_store().verify_many(_addresses(body, MAX_VERIFY_ADDRESSES))
    return HttpResponse(encode_address_lists([good, corrupt]), content_type="application/octet-stream")


peer_fetch = peer_signed(_fetch, factory.peer_auth, max_body=MAX_FETCH_ADDRESSES * ADDRESS_SIZE)
peer_has = peer_signed(_has, factory.peer_auth, max_body=MAX_HAS_ADDRESSES * ADDRESS_SIZE)
peer_verify = peer_signed(_verify, factory.peer_auth, max_body=MAX_VERIFY_ADDRESSES * ADDRESS_SIZE)


# --- user API ------------------------------------------------------------------------------
def _parse_ref(text: str) -> Reference:
    try:
        return Reference.parse(text)
    except InvalidReference as exc:
        raise ValidationError({"reference": [str(exc)]}) from exc


class UploadResponseSerializer(serializers.Serializer):
    reference = serializers.CharField()
    size = serializers.IntegerField()
    encrypted = serializers.BooleanField()


class BlobStatSerializer(serializers.Serializer):
    reference = serializers.CharField()
    size = serializers.IntegerField()
    chunks = serializers.IntegerField()
    encrypted = serializers.BooleanField()
    pinned_here = serializers.BooleanField()


class NodeEntrySerializer(serializers.Serializer):
    address = serializers.CharField()
    url = serializers.CharField(allow_blank=True)
    local = serializers.BooleanField()
    up = serializers.BooleanField()


class StoreUsageSerializer(serializers.Serializer):
    chunks = serializers.IntegerField()
    bytes = serializers.IntegerField()
    pinned_chunks = serializers.IntegerField()
    pinned_bytes = serializers.IntegerField()


class NodeStatSerializer(serializers.Serializer):
    address = serializers.CharField()
    replication = serializers.IntegerField()
    nodes = NodeEntrySerializer(many=True)
    usage = StoreUsageSerializer()


_REFERENCE = OpenApiParameter(
    "reference",
    OpenApiTypes.STR,
    OpenApiParameter.PATH,
    description="64 hex characters, or 128 for an encrypted blob (address and key); another is a 400",
    pattern="^(0x)?([0-9a-fA-F]{64}|[0-9a-fA-F]{128})$",
)
_BINARY = {"application/octet-stream": OpenApiTypes.BINARY}


class _Counter:
    def __init__(self) -> None:
        self.done = 0

    def __call__(self, done: int) -> None:
        self.done = done


_FLAGS = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}


def _flag(request: Request, name: str) -> bool:
    """A boolean query parameter: absent is false; a value that is not a boolean is a 400."""
    value = request.query_params.get(name)
    if value is None:
        return False
    if value.lower() not in _FLAGS:
        raise ValidationError({name: ["must be true or false"]})
    return _FLAGS[value.lower()]


def _upload_length(request: Request) -> int:
    """The upload's Content-Length, within this node's pinned-bytes quota (411 / 413 otherwise).

    Every upload counts against the quota, pinned or not: its chunks land on other
    organisations' disks either way.
    """
    try:
        length = int(request.META.get("CONTENT_LENGTH") or -1)
    except ValueError:
        length = -1
    if length < 0:
        raise _UploadRefused(411, "an upload needs a Content-Length")
    quota = settings.DEFL_SWARM_PIN_QUOTA_BYTES
    pinned = factory.local_store().usage().pinned_bytes
    if pinned + length > quota:
        raise _UploadRefused(
            413,
            f"this upload ({length} bytes) would exceed the node's quota: {pinned} of {quota} bytes "
            "are pinned (DEFL_SWARM_PIN_QUOTA_BYTES)",
        )
    return length


class _UploadRefused(APIException):
    def __init__(self, status_code: int, detail: str) -> None:
        self.status_code = status_code
        super().__init__(detail)


class UploadView(APIView):
    """POST a file: the raw body (application/octet-stream, streamed) or a multipart ``file``.

    Query parameters: ``encrypt=1`` for an encrypted reference, ``pin=1`` to keep a full
    copy on this node. Operators only (its chunks go to other organisations' disks),
    within the node's quota. A raw body streams through the pipeline chunk by chunk; a
    multipart file is held in memory up to DEFL_MAX_UPLOAD_BYTES and never spooled to a
    plaintext temp file.
    """

    permission_classes = [OperatorWrites]
    parser_classes = [MultiPartParser, FileUploadParser]
    request_body_required = True  # the schema says so: an upload without a body is a 411 or a 400

    def initial(self, request: Request, *args: object, **kwargs: object) -> None:
        super().initial(request, *args, **kwargs)  # authentication and permissions first
        request.upload_handlers = [BoundedMemoryUploadHandler(request)]

    @extend_schema(
        request={
            **_BINARY,
            "multipart/form-data": inline_serializer(
                "SwarmUploadForm", fields={"file": serializers.FileField()}
            ),
        },
        parameters=[
            OpenApiParameter("encrypt", OpenApiTypes.BOOL, description="store an encrypted blob"),
            OpenApiParameter("pin", OpenApiTypes.BOOL, description="keep a full copy on this node"),
        ],
        responses={201: UploadResponseSerializer, **errors(411, 503)},
    )
    def post(self, request: Request) -> Response:
        encrypt = _flag(request, "encrypt")
        pin = _flag(request, "pin")
        if _upload_length(request) == 0:
            raise ValidationError({"file": ["empty upload"]})
        if request.content_type.startswith("multipart/"):
            upload = request.data.get("file")
            if upload is None:
                raise ValidationError({"file": ["a multipart upload needs a 'file' part"]})
            # A part without a filename arrives as text: an upload is bytes, never a name of
            # anything on this node.
            if not isinstance(upload, UploadedFile):
                raise ValidationError({"file": ["the 'file' part must be a file (a part with a filename)"]})
            if upload.size == 0:
                raise ValidationError({"file": ["empty upload"]})
            # An UploadedFile reads like a binary file (read(n) -> bytes); the stubs do not say so.
            stream = cast(BinaryIO, upload)
        else:
            # Never parse the raw body: the pipeline reads the socket stream chunk by chunk.
            stream = request.stream
            if stream is None:
                raise ValidationError({"file": ["empty upload"]})
        counter = _Counter()
        reference = factory.node_swarm().put(stream, encrypt=encrypt, pin=pin, progress=counter)
        body = {"reference": str(reference), "size": counter.done, "encrypted": reference.encrypted}
        return Response(UploadResponseSerializer(body).data, status=201)


class DownloadView(APIView):
    """GET a blob by reference, streamed (the blob is never held in memory).

    At most DEFL_SWARM_MAX_BLOB_BYTES: a larger root is refused before any other chunk.
    """

    permission_classes = [OperatorWrites]

    @extend_schema(
        parameters=[_REFERENCE],
        responses={
            (200, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY, description="the blob"),
            **errors(413, 503),
        },
    )
    def get(self, request: Request, reference: str) -> StreamingHttpResponse:
        ref = _parse_ref(reference)
        swarm = factory.node_swarm()
        limit = settings.DEFL_SWARM_MAX_BLOB_BYTES
        size = blob_span(
            ref, NetworkSource(swarm.network), chunk_size=swarm.chunk_size
        )  # a missing root: 404
        if size > limit:
            raise BlobTooLarge(size, limit)

        def chunks() -> Iterator[bytes]:
            for piece in swarm.open(ref, max_bytes=limit):
                yield bytes(piece)

        response = StreamingHttpResponse(chunks(), content_type="application/octet-stream")
        response["Content-Length"] = str(size)
        response["Content-Disposition"] = f'attachment; filename="{ref.address.hex()[:16]}.bin"'
        return response


class StatView(APIView):
    """GET a blob's size, chunk count and whether it is encrypted or pinned here."""

    permission_classes = [OperatorWrites]

    @extend_schema(parameters=[_REFERENCE], responses={200: BlobStatSerializer, **errors(413, 503)})
    def get(self, request: Request, reference: str) -> Response:
        limit = settings.DEFL_SWARM_MAX_BLOB_BYTES
        stat = factory.node_swarm().stat(_parse_ref(reference), max_bytes=limit)
        return Response(BlobStatSerializer(stat.__dict__).data)


class NodeStatView(APIView):
    """GET this node's store usage (for the dashboard) and the nodes it replicates to."""

    permission_classes = [OperatorWrites]

    @extend_schema(responses=NodeStatSerializer)
    def get(self, request: Request) -> Response:
        stat = factory.node_swarm().node_stat()
        body = {
            "address": stat.address,
            "replication": stat.replication,
            "nodes": stat.nodes,
            "usage": stat.usage.__dict__,
        }
        return Response(NodeStatSerializer(body).data)
