"""Client ID Metadata Documents fetched through the platform's address check.

DOT (``oauth2_provider.cimd``) resolves a ``client_id`` that is an ``https`` URL by fetching the
JSON document it names, checking that the document's ``client_id`` equals the URL, and making a
public client of its ``redirect_uris`` (the authorization request's ``redirect_uri`` must then be
one of them). This module is its fetcher (``OAUTH2_PROVIDER["CIMD_METADATA_FETCHER"]``): the GET
goes through :func:`capabilities.netsafe.safe_fetch`, like every URL the platform reaches on
someone's behalf (no loopback, private, link-local or metadata address, at every connect;
``WEB_FETCH_ALLOWED_CIDRS`` as configured), with no redirect followed, at most
``CIMD_MAX_DOCUMENT_SIZE`` bytes, within ``CIMD_FETCH_TIMEOUT_SECONDS``; the document is kept
``CIMD_METADATA_MAX_AGE_SECONDS`` (its ``Cache-Control`` is not read).
"""

from __future__ import annotations

import json
from typing import Any

from asgiref.sync import async_to_sync
from oauth2_provider.cimd import CIMDError
from oauth2_provider.settings import oauth2_settings

from capabilities.netsafe import FetchError, safe_fetch


class NetsafeMetadataFetcher:
    """DOT's CIMD fetcher interface: ``fetch(client_id) -> (metadata, max_age_seconds)``."""

    def fetch(self, client_id: str) -> tuple[dict[str, Any], int]:
        """GET the document at ``client_id``.

        Raises:
            CIMDError: not https, a blocked address, a redirect, a timeout or network error, a
                status other than 200, not JSON, too large, not an object. DOT then treats the
                client as unknown (the authorization request fails with ``invalid_client``).
        """
        if not client_id.lower().startswith("https://"):
            raise CIMDError("client_id URL must use https")
        max_bytes = oauth2_settings.CIMD_MAX_DOCUMENT_SIZE
        try:
            result = async_to_sync(safe_fetch)(
                client_id,
                max_bytes=max_bytes,
                accept="application/json",
                total_timeout_seconds=oauth2_settings.CIMD_FETCH_TIMEOUT_SECONDS,
            )
        except FetchError as exc:
            raise CIMDError(f"could not fetch the client_id document: {exc}") from exc
        if result.redirects:
            raise CIMDError("the client_id document redirected (not followed)")
        if result.status_code != 200:
            raise CIMDError(f"the client_id document answered HTTP {result.status_code}")
        if result.truncated:
            raise CIMDError("the client_id document is too large")
        if result.mime_type != "application/json" and not result.mime_type.endswith("+json"):
            raise CIMDError(f"the client_id document is not JSON ({result.mime_type!r})")
        try:
            data = json.loads(result.body)
        except ValueError as exc:
            raise CIMDError("the client_id document is not valid JSON") from exc
        if not isinstance(data, dict):
            raise CIMDError("the client_id document is not a JSON object")
        # kept CIMD_METADATA_MAX_AGE_SECONDS (safe_fetch does not hand back Cache-Control)
        return data, oauth2_settings.CIMD_METADATA_MAX_AGE_SECONDS
