"""ApiVersions (18): the supported-versions table (protocol.api_versions)."""

from __future__ import annotations

from typing import Any

from shmq.protocol import api_versions


async def handle(ctx: Any, header: Any, request: Any) -> Any:
    return api_versions.api_versions_response(header.api_version)
