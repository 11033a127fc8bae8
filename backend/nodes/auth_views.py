"""Login, logout and "who am I" for the dashboard (session) and for API clients (token)."""

from django.conf import settings
from django.contrib.auth import authenticate, login, logout
from django.middleware.csrf import get_token
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.authentication import SessionAuthentication
from rest_framework.authtoken.models import Token
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.api.authentication import ExpiringTokenAuthentication
from backend.api.permissions import AnyRole
from backend.api.throttling import LoginAddressThrottle, LoginLockout, LoginUsernameThrottle
from backend.api.uploads import RequestTooLarge
from backend.identity.roles import role_of
from backend.nodes.accounts import api_token
from backend.nodes.serializers import LoginResponseSerializer, LoginSerializer, MeSerializer

LOGIN_BODY_BYTES = 16 * 1024  # a username and a password


def _me(user) -> dict:
    role = role_of(user)
    return {"username": user.get_username(), "role": role.value if role else None}


class LoginView(APIView):
    """Password login; throttled per address and per username, locked out after repeated failures."""

    # No authenticators: a login must work without a session (and so without CSRF).
    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes = [LoginAddressThrottle, LoginUsernameThrottle]

    def initial(self, request, *args, **kwargs):
        # Anyone may post here: refuse a large body from its header, before a byte of it is read.
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if length > LOGIN_BODY_BYTES:
            raise RequestTooLarge(LOGIN_BODY_BYTES)
        super().initial(request, *args, **kwargs)

    def get_authenticate_header(self, request) -> str:
        # Without authenticators DRF would turn a failed login into 403; it is a 401.
        return "Token"

    @extend_schema(request=LoginSerializer, responses={200: LoginResponseSerializer}, auth=[])
    def post(self, request):
        serializer = LoginSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        lockout = LoginLockout(request)
        lockout.check()  # before the password is even checked: a locked account gives no oracle
        user = authenticate(request, **serializer.validated_data)
        if user is None or role_of(user) is None:
            lockout.failed()
            # One message for both, so that the API does not reveal which usernames exist.
            raise AuthenticationFailed("wrong username or password, or the account has no role")
        lockout.succeeded()
        login(request, user)
        get_token(request)  # sets the CSRF cookie the dashboard sends back on writes
        token = api_token(user, valid_for_s=settings.DEFL_TOKEN_TTL_S / 2)
        return Response({"token": token, "user": _me(user)})


class LogoutView(APIView):
    authentication_classes = [ExpiringTokenAuthentication, SessionAuthentication]
    permission_classes = [AnyRole]

    @extend_schema(request=None, responses={204: None})
    def post(self, request):
        # Logging out ends the session and revokes the token: the next login issues a new one.
        Token.objects.filter(user=request.user).delete()
        logout(request)
        return Response(status=status.HTTP_204_NO_CONTENT)


class MeView(APIView):
    permission_classes = [AnyRole]

    @extend_schema(responses={200: MeSerializer})
    def get(self, request):
        return Response(_me(request.user))
