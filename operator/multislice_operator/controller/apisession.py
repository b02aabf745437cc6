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

JSON both ways is orjson's: the standard library's encoder and decoder were a sixth of the
operator's CPU under a 1000-job load (every request body, every answer, every watch event;
docs/benchmarks.md). Requests are encoded by the session (aiohttp's `json_serialize_bytes`, made
for such encoders); kopf decodes each watch event with the `json` module its client imports
(kopf/_cogs/clients/api.py `stream`), which `decode_watch_events_with_orjson` points at orjson's
`loads`; answers to the operator's own calls are decoded in controller/kube.py.
"""

from __future__ import annotations

import json
import types
from typing import Any

import aiohttp
import kopf
import orjson
from kopf._cogs.clients import api as kopf_api

API_KEEPALIVE_SECONDS = 2.0


class _OrjsonDecoding(types.ModuleType):
    """The `json` module with orjson's `loads` (bytes or str in, the same Python values out);
    anything else kopf's client might take from `json` is the standard library's."""

    loads = staticmethod(orjson.loads)

    def __getattr__(self, name: str) -> Any:
        return getattr(json, name)


def decode_watch_events_with_orjson() -> None:
    """Point kopf's client module at orjson for the watch streams' events (idempotent)."""
    if not isinstance(getattr(kopf_api, "json", None), _OrjsonDecoding):
        setattr(kopf_api, "json", _OrjsonDecoding("json"))  # noqa: B010 (kopf does not export it)


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
        json_serialize_bytes=orjson.dumps,
    )
    decode_watch_events_with_orjson()
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
