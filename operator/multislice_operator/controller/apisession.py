"""The operator's HTTP session to the apiserver: kopf's own, with a short keep-alive.

aiohttp hands out a host's idle connections first in, first out (`TCPConnector._get` pops the
oldest, `_release` appends), and closes one only once it has been idle for the keep-alive
(15 s by default). A burst (jobs created or deleted together) opens one connection per request
in flight; afterwards a steady trickle (here about one request a second: leases, heartbeats,
resyncs) takes them in turn, so none is ever idle for 15 s and the burst's connections, with
their TLS buffers, are kept for good: 22 against 7 at idle after an 80-job load
(docs/benchmarks.md). With a keep-alive shorter than the trickle's cycle the pool shrinks back
to what the trickle needs; a new connection to the apiserver costs a TLS handshake, once per
idle gap of API_KEEPALIVE_SECONDS at most.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import kopf

API_KEEPALIVE_SECONDS = 2.0


def api_session(info: kopf.ConnectionInfo) -> kopf.AiohttpSession:
    """kopf's session for `info` (kopf/_cogs/clients/auth.py, APIContext: the same connector,
    headers, proxy), with the keep-alive above. kopf closes it when it logs in again."""
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(
            limit=0, ssl=info.as_ssl_context(), keepalive_timeout=API_KEEPALIVE_SECONDS
        ),
        headers=info.as_http_headers(),
        proxy=info.proxy_url,
        trust_env=info.trust_env,
    )
    return kopf.AiohttpSession(
        aiohttp_session=session,
        server=info.server,
        default_namespace=info.default_namespace,
        priority=info.priority,
        expiration=info.expiration,
    )


@kopf.on.login()
async def login(logger: kopf.Logger, settings: kopf.OperatorSettings, **_: Any) -> Any:
    """kopf's default logins, first found wins, on the session above (one registered handler
    replaces kopf's own, so each is asked here): the kubernetes client's configuration where that
    library is installed (tests, a developer's machine: in-cluster, else KUBECONFIG), else kopf's
    service-account login (the operator's image ships no kubernetes library: in a pod), else its
    kubeconfig reader (KUBECONFIG). Async: the session is made on the operator's loop."""
    info = (
        kopf.login_via_client(logger=logger, settings=settings)
        or kopf.login_with_service_account(logger=logger, settings=settings)
        or kopf.login_with_kubeconfig(logger=logger, settings=settings)
    )
    return None if info is None else api_session(info)
