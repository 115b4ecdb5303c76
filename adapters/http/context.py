"""What every handler reaches through the application: the services of the process."""

from __future__ import annotations

from aiohttp import web

from adapters.bootstrap import Services

__all__ = ["SERVICES", "Services", "services"]

SERVICES = web.AppKey("turnlog_services", Services)


def services(request: web.Request) -> Services:
    return request.app[SERVICES]
