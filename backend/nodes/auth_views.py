"""Login, logout and "who am I" for the dashboard (session) and for API clients (token).

Every login is its own: it gets a token of its own (and, in a browser, a session of its own),
and logging out ends that login only, never the user's other devices or scripts.
"""

from django.contrib.auth import authenticate, login, logout
from django.middleware.csrf import get_token
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.authentication import SessionAuthentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.api.permissions import AnyRole
from backend.api.schema import errors
from backend.api.throttling import (
    LoginAddressThrottle,
    LoginLockout,
    LoginUsernameThrottle,
    RefusesLoginsPolitely,
)
from backend.api.uploads import RequestTooLarge
from backend.identity.roles import role_of
from backend.nodes import tokens
from backend.nodes.authentication import ApiTokenAuthentication
from backend.nodes.models import ApiToken
from backend.nodes.serializers import LoginResponseSerializer, LoginSerializer, MeSerializer

LOGIN_BODY_BYTES = 16 * 1024  # a username, a password and a device name
# The session remembers its login's token, so that a logout through the session ends both.
SESSION_TOKEN_KEY = "defl_token_id"


def me(user) -> dict:
    role = role_of(user)
    return {"username": user.get_username(), "role": role.value if role else None}


def refuse_large_body(request, limit: int) -> None:
    """Anyone may post to a login: refuse a large body from its header, before a byte is read."""
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > limit:
        raise RequestTooLarge(limit)


class LoginView(RefusesLoginsPolitely, APIView):
    """Password login; throttled per address and per username, locked out after repeated failures."""

    # No authenticators: a login must work without a session (and so without CSRF).
    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes = [LoginAddressThrottle, LoginUsernameThrottle]

    def initial(self, request, *args, **kwargs):
        refuse_large_body(request, LOGIN_BODY_BYTES)
        super().initial(request, *args, **kwargs)

    def get_authenticate_header(self, request) -> str:
        # Without authenticators DRF would turn a failed login into 403; it is a 401.
        return "Token"

    @extend_schema(
        request=LoginSerializer,
        responses={200: LoginResponseSerializer, **errors(400, 401, 413, 415, 429)},
        auth=[],
    )
    def post(self, request):
        serializer = LoginSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        credentials = {key: serializer.validated_data[key] for key in ("username", "password")}
        lockout = LoginLockout(request)
        lockout.check()  # before the password is even checked: a locked account gives no oracle
        user = authenticate(request, **credentials)
        if user is None or role_of(user) is None:
            lockout.failed()
            # One message for both, so that the API does not reveal which usernames exist.
            raise AuthenticationFailed("wrong username or password, or the account has no role")
        lockout.succeeded()
        login(request, user)
        get_token(request)  # sets the CSRF cookie the dashboard sends back on writes
        device = tokens.device_name(
            serializer.validated_data.get("device"), request.headers.get("User-Agent", "")
        )
        token, key = tokens.issue_login_token(user, device)
        request.session[SESSION_TOKEN_KEY] = token.pk
        return Response({"token": key, "token_id": token.pk, "expires": token.expires, "user": me(user)})


class LogoutView(APIView):
    authentication_classes = [ApiTokenAuthentication, SessionAuthentication]
    permission_classes = [AnyRole]

    @extend_schema(request=None, responses={204: None, **errors(401, 403)})
    def post(self, request):
        # This login only: the token of this request, or the one this browser's session holds.
        if isinstance(request.auth, ApiToken):
            request.auth.delete()
        session_token = request.session.get(SESSION_TOKEN_KEY)
        if session_token is not None:
            ApiToken.objects.filter(pk=session_token, user=request.user).delete()
        logout(request)
        return Response(status=status.HTTP_204_NO_CONTENT)


class MeView(APIView):
    permission_classes = [AnyRole]

    @extend_schema(responses={200: MeSerializer, **errors(401, 403)})
    def get(self, request):
        return Response(me(request.user))
