"""Authentication endpoints for the SPA and token management for scripts."""

from __future__ import annotations

from django.contrib.auth import authenticate, login, logout
from drf_spectacular.utils import extend_schema
from rest_framework import permissions, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agent_platform.api_errors import ApplicationError, NotFound
from tenants.api.mixins import TenantScopedApiView
from tenants.models import ApiToken
from tenants.selectors import membership_for_user
from tenants.services import api_token_create, api_token_revoke


class _MeSerializer(serializers.Serializer):
    user = serializers.DictField()
    tenant = serializers.DictField()
    role = serializers.CharField()


def _me(request: Request, membership) -> dict:
    return {
        "user": {"id": request.user.pk, "username": request.user.get_username()},
        "tenant": {"id": membership.tenant_id, "name": membership.tenant.name, "slug": membership.tenant.slug},
        "role": membership.role,
    }


class AuthLoginApi(APIView):
    """Log in with username and password (session cookie). Only users with a membership."""

    permission_classes = [permissions.AllowAny]

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "LoginInput"

        username = serializers.CharField()
        password = serializers.CharField(style={"input_type": "password"})

    @extend_schema(request=InputSerializer, responses=_MeSerializer)
    def post(self, request: Request) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        user = authenticate(request, username=data.validated_data["username"], password=data.validated_data["password"])
        if user is None:
            raise ApplicationError("Wrong username or password.")
        membership = membership_for_user(user=user)
        if membership is None:
            raise ApplicationError("This user is not a member of any tenant.", status_code=status.HTTP_403_FORBIDDEN)
        login(request._request, user)
        request.user = user
        return Response(_me(request, membership))


class AuthLogoutApi(APIView):
    permission_classes = [permissions.AllowAny]

    @extend_schema(request=None, responses={204: None})
    def post(self, request: Request) -> Response:
        logout(request._request)
        return Response(status=status.HTTP_204_NO_CONTENT)


class AuthMeApi(TenantScopedApiView):
    """Who is calling, in which tenant, with which role."""

    @extend_schema(responses=_MeSerializer)
    def get(self, request: Request) -> Response:
        return Response(_me(request, request.membership))


class ApiTokenOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "last_used_at", "revoked_at"]


class ApiTokenListCreateApi(TenantScopedApiView):
    """The caller's own API tokens; POST issues one (the raw token is in the response, once)."""

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "TokenCreateInput"

        name = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")

    @extend_schema(responses=ApiTokenOutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        tokens = ApiToken.objects.filter(membership=request.membership)
        return Response(ApiTokenOutputSerializer(tokens, many=True).data)

    @extend_schema(request=InputSerializer, responses={201: ApiTokenOutputSerializer})
    def post(self, request: Request) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        issued = api_token_create(membership=request.membership, name=data.validated_data["name"])
        return Response(
            {**ApiTokenOutputSerializer(issued.token).data, "token": issued.raw}, status=status.HTTP_201_CREATED
        )


class ApiTokenRevokeApi(TenantScopedApiView):
    @extend_schema(request=None, responses=ApiTokenOutputSerializer)
    def post(self, request: Request, token_id: int) -> Response:
        token = ApiToken.objects.filter(pk=token_id, membership=request.membership).first()
        if token is None:
            raise NotFound("Token not found.")
        return Response(ApiTokenOutputSerializer(api_token_revoke(token=token)).data)
