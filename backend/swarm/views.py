"""HTTP endpoints: the signed peer API between nodes and the user API.

Peer endpoints are plain Django views over binary bodies (no DRF parsing or sessions on
the data path); each verifies the request signature first. User endpoints are DRF
views with the project's authentication; swarm errors reach the project's exception
handler (backend/api/exception_handler.py), which maps the SwarmError family to HTTP.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.parsers import FileUploadParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.swarm import factory
from backend.swarm.download import NetworkSource
from backend.swarm.errors import InvalidReference, SignatureError, UnregisteredSigner
from backend.swarm.joiner import blob_span
from backend.swarm.receive import read_body
from backend.swarm.reference import Reference
from backend.swarm.signing import verify_request
from backend.swarm.wire import (
    batch_digest,
    decode_addresses,
    decode_batch,
    encode_address_lists,
    encode_addresses,
    encode_batch,
)

PeerView = Callable[[HttpRequest, memoryview], HttpResponse]


# --- peer API ------------------------------------------------------------------------------
def _body_length(request: HttpRequest) -> int:
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise SignatureError("bad Content-Length") from None
    if not 0 <= length <= settings.DEFL_SWARM_MAX_BATCH_BYTES:
        raise SignatureError("request body too large")
    return length


def peer_signed(
    view: PeerView, digest: Callable[[memoryview], str] | None = None
) -> Callable[[HttpRequest], HttpResponse]:
    @csrf_exempt
    @require_POST
    def wrapper(request: HttpRequest) -> HttpResponse:
        try:
            length = _body_length(request)
            # Not request.body: the body may exceed DATA_UPLOAD_MAX_MEMORY_SIZE, and
            # read_body skips the server's copies (receive.py). The view's response must
            # not refer to the body: its buffer is reused once the block ends.
            with read_body(request, length) as body:
                verify_request(
                    method=request.method or "POST",
                    path=request.get_full_path(),
                    headers=request.headers,
                    body=body,
                    digest=digest(body) if digest else None,
                    is_registered=factory.peer_directory().is_registered,
                    nonces=factory.nonce_cache(),
                    max_skew_s=settings.DEFL_SWARM_CLOCK_SKEW_S,
                )
                return view(request, body)
        except ValueError as exc:  # a body cut short, a malformed batch or address list
            return JsonResponse({"detail": str(exc)}, status=400)
        except UnregisteredSigner as exc:
            return JsonResponse({"detail": str(exc)}, status=403)
        except SignatureError as exc:
            return JsonResponse({"detail": str(exc)}, status=401)

    wrapper.__name__ = view.__name__
    return wrapper


def _push(request: HttpRequest, body: memoryview) -> HttpResponse:
    """Store a batch of chunks; answer with the addresses now held (bad chunks are left out).

    The store hashes every chunk against its address before writing it (verify=True):
    the signature covers only the addresses (see signing.py).
    """
    held = factory.local_store().put_many(list(decode_batch(body)), verify=True)
    return HttpResponse(encode_addresses(held), content_type="application/octet-stream")


peer_push = peer_signed(_push, digest=batch_digest)


@peer_signed
def peer_fetch(request: HttpRequest, body: memoryview) -> HttpResponse:
    """Return the asked chunks this node holds (verified on read; corrupt copies are left out)."""
    transport = factory.local_transport()
    found = transport.fetch(decode_addresses(body))
    return HttpResponse(encode_batch(found.items()), content_type="application/octet-stream")


@peer_signed
def peer_has(request: HttpRequest, body: memoryview) -> HttpResponse:
    held = factory.local_store().has_many(decode_addresses(body))
    return HttpResponse(encode_addresses(held), content_type="application/octet-stream")


@peer_signed
def peer_verify(request: HttpRequest, body: memoryview) -> HttpResponse:
    """Scrub the asked copies (re-read, re-hash); answer with the good and the corrupt ones.

    Corrupt copies are quarantined, so the asking node (repairing) pushes good ones back.
    """
    good, corrupt = factory.local_store().verify_many(decode_addresses(body))
    return HttpResponse(encode_address_lists([good, corrupt]), content_type="application/octet-stream")


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
    description="64 hex characters, or 128 for an encrypted blob (address and key)",
)
_BINARY = {"application/octet-stream": OpenApiTypes.BINARY}


class _Counter:
    def __init__(self) -> None:
        self.done = 0

    def __call__(self, done: int) -> None:
        self.done = done


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in {"1", "true", "yes", "on"}


class UploadView(APIView):
    """POST a file: the raw body (application/octet-stream, streamed) or a multipart ``file``.

    Query parameters: ``encrypt=1`` for an encrypted reference, ``pin=1`` to keep a full
    copy on this node.
    """

    parser_classes = [MultiPartParser, FileUploadParser]

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
        responses={201: UploadResponseSerializer},
    )
    def post(self, request: Request) -> Response:
        encrypt = _truthy(request.query_params.get("encrypt"))
        pin = _truthy(request.query_params.get("pin"))
        if request.content_type.startswith("multipart/"):
            upload = request.data.get("file")
            if upload is None:
                raise ValidationError({"file": ["a multipart upload needs a 'file' part"]})
            stream = upload
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
    """GET a blob by reference, streamed (the blob is never held in memory)."""

    @extend_schema(
        parameters=[_REFERENCE],
        responses={
            (200, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY, description="the blob")
        },
    )
    def get(self, request: Request, reference: str) -> StreamingHttpResponse:
        ref = _parse_ref(reference)
        swarm = factory.node_swarm()
        size = blob_span(ref, NetworkSource(swarm.network))  # a missing root fails here, as a 404

        def chunks() -> Iterator[bytes]:
            for piece in swarm.open(ref):
                yield bytes(piece)

        response = StreamingHttpResponse(chunks(), content_type="application/octet-stream")
        response["Content-Length"] = str(size)
        response["Content-Disposition"] = f'attachment; filename="{ref.address.hex()[:16]}.bin"'
        return response


class StatView(APIView):
    """GET a blob's size, chunk count and whether it is encrypted or pinned here."""

    @extend_schema(parameters=[_REFERENCE], responses=BlobStatSerializer)
    def get(self, request: Request, reference: str) -> Response:
        stat = factory.node_swarm().stat(_parse_ref(reference))
        return Response(BlobStatSerializer(stat.__dict__).data)


class NodeStatView(APIView):
    """GET this node's store usage (for the dashboard) and the nodes it replicates to."""

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
