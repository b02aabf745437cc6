"""The operator's own HTTP surface: /healthz and /readyz for the kubelet, /metrics for Prometheus.

Metrics name every tenant's jobs, so by default they are served as controller-runtime's secure
metrics serve them for JobSet and Kueue (pkg/metrics/filters): over HTTPS, each request's bearer
token authenticated by a TokenReview and authorized by a SubjectAccessReview for `get` on the
non-resource URL /metrics (a ClusterRole with `nonResourceURLs: ["/metrics"]` grants it), answers
cached as controller-runtime's are (1 minute per token; 5 minutes allowed, 30 s denied per user).
`--metrics-auth none` serves plain HTTP without authentication, and only on a loopback address
(settings.Settings.problems refuses anything else). Both servers run on kopf's event loop
(aiohttp, kopf's own HTTP library): no thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import ssl
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from multislice_operator.controller import metrics
from multislice_operator.controller.kube import ApiError, Kube

log = logging.getLogger("multislice_operator.serving")

METRICS_PATH = "/metrics"
TOKEN_TTL_SECONDS = 60.0  # controller-runtime: DelegatingAuthenticatorConfig.CacheTTL
ALLOW_TTL_SECONDS = 300.0  # DelegatingAuthorizerConfig.AllowCacheTTL
DENY_TTL_SECONDS = 30.0  # DelegatingAuthorizerConfig.DenyCacheTTL
CACHE_ENTRIES = 1024
CERT_CHECK_SECONDS = 60.0


# ---------------------------------------------------------------- health


@dataclass
class Readiness:
    """Whether this replica should receive traffic and count as available: started, its caches
    synced (controller/handlers.py decides when), and with leader election the Lease held."""

    started: bool = False
    synced: bool = False
    leader_elect: bool = False
    leading: bool = False
    standby_ready: bool = False  # --ready-standby

    def why_not(self) -> str | None:
        if not self.started:
            return "starting"
        if not self.synced:
            return "caches not synced"
        if self.leader_elect and not self.leading and not self.standby_ready:
            return "standby: the leader-election Lease is held by another replica"
        return None


def health_app(readiness: Readiness, alive: Callable[[], str | None]) -> web.Application:
    """/healthz: 200 while the event loop answers and no worker died (`alive` says which did);
    /readyz: 200 when `readiness` has nothing against it, else 503 with the reason."""

    async def healthz(_: web.Request) -> web.Response:
        problem = alive()
        return web.Response(status=500 if problem else 200, text=problem or "ok")

    async def readyz(_: web.Request) -> web.Response:
        problem = readiness.why_not()
        return web.Response(status=503 if problem else 200, text=problem or "ok")

    app = web.Application()
    app.add_routes([web.get("/healthz", healthz), web.get("/readyz", readyz)])
    return app


# ---------------------------------------------------------------- metrics authentication


class _TtlCache:
    """A small expiring map (cleared when full: entries are cheap to ask again)."""

    def __init__(self) -> None:
        self._items: dict[Any, tuple[float, Any]] = {}

    def get(self, key: Any) -> tuple[bool, Any]:
        hit = self._items.get(key)
        if hit is None or hit[0] < time.monotonic():
            self._items.pop(key, None)
            return False, None
        return True, hit[1]

    def put(self, key: Any, value: Any, ttl: float) -> None:
        if len(self._items) >= CACHE_ENTRIES:
            self._items.clear()
        self._items[key] = (time.monotonic() + ttl, value)


class KubernetesAuth:
    """TokenReview + SubjectAccessReview, cached, as controller-runtime's metrics filter."""

    def __init__(self, kube: Kube, path: str = METRICS_PATH) -> None:
        self.kube, self.path = kube, path
        self._tokens = _TtlCache()
        self._decisions = _TtlCache()

    async def check(self, authorization: str | None) -> tuple[int, str]:
        """(HTTP status, message): 200 to serve, 401 without a valid token, 403 when the
        token's user may not get the path, 500 when the apiserver could not say."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return 401, "Unauthorized"
        try:
            user = await self._user(token.strip())
            if user is None:
                return 401, "Unauthorized"
            name = str(user.get("username", ""))
            if not await self._allowed(user):
                return 403, f"Authorization denied for user {name}"
        except (ApiError, OSError, TimeoutError) as exc:
            log.warning("metrics authentication failed error=%r", exc)
            return 500, "Authentication failed"
        return 200, "ok"

    async def _user(self, token: str) -> dict[str, Any] | None:
        key = hashlib.sha256(token.encode()).hexdigest()
        hit, user = self._tokens.get(key)
        if not hit:
            user = await self.kube.review_token(token)
            self._tokens.put(key, user, TOKEN_TTL_SECONDS)
        return user  # type: ignore[no-any-return]

    async def _allowed(self, user: dict[str, Any]) -> bool:
        key = (
            user.get("username"),
            user.get("uid"),
            tuple(sorted(user.get("groups") or [])),
            tuple(sorted((k, tuple(v)) for k, v in (user.get("extra") or {}).items())),
        )
        hit, allowed = self._decisions.get(key)
        if not hit:
            allowed = await self.kube.may_get(user, self.path)
            self._decisions.put(key, allowed, ALLOW_TTL_SECONDS if allowed else DENY_TTL_SECONDS)
        return bool(allowed)


Check = Callable[[str | None], Awaitable[tuple[int, str]]]


def metrics_app(check: Check | None) -> web.Application:
    """/metrics from metrics.REGISTRY; `check` (None: no authentication) guards it."""

    async def serve(request: web.Request) -> web.Response:
        if check is not None:
            status, message = await check(request.headers.get("Authorization"))
            if status != 200:
                return web.Response(status=status, text=message)
        body = generate_latest(metrics.REGISTRY)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.add_routes([web.get(METRICS_PATH, serve)])
    return app


# ---------------------------------------------------------------- TLS


def self_signed(hosts: list[str]) -> tuple[bytes, bytes]:
    """A throwaway certificate and key (PEM), as controller-runtime makes when given no
    certificate: scrapers of a self-signed endpoint skip verification (insecureSkipVerify)."""

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    names = subject_alt_names(hosts)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "multislice-operator-metrics")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def _context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def subject_alt_names(hosts: list[str]) -> list[Any]:
    """x509 SANs for `hosts`: an IP address where one parses, a DNS name otherwise."""
    import ipaddress

    from cryptography import x509

    names: list[Any] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def tls_context(cert_dir: str | None, hosts: list[str]) -> ssl.SSLContext:
    """From cert_dir's tls.crt and tls.key (a kubernetes.io/tls Secret's keys), else a
    self-signed certificate (ssl loads only files: written to a private temporary directory and
    removed at once)."""
    ctx = _context()
    if cert_dir:
        ctx.load_cert_chain(Path(cert_dir) / "tls.crt", Path(cert_dir) / "tls.key")
        return ctx
    cert, key = self_signed(hosts)
    with tempfile.TemporaryDirectory(prefix="msj-metrics-") as tmp:
        cert_path, key_path = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        cert_path.write_bytes(cert)
        key_path.touch(mode=0o600)
        key_path.write_bytes(key)
        ctx.load_cert_chain(cert_path, key_path)
    return ctx


async def reload_certificates(ctx: ssl.SSLContext, cert_dir: str) -> None:
    """cert-manager renews the Secret in place: load the new pair when the files change (new
    connections get it; an SSLContext may load a chain again)."""
    paths = (Path(cert_dir) / "tls.crt", Path(cert_dir) / "tls.key")

    def stamp() -> tuple[float, ...]:
        return tuple(os.stat(p).st_mtime for p in paths)

    seen = stamp()
    while True:
        await asyncio.sleep(CERT_CHECK_SECONDS)
        try:
            now = stamp()
            if now != seen:
                ctx.load_cert_chain(*paths)
                seen = now
                log.info("metrics certificate reloaded dir=%s", cert_dir)
        except (OSError, ssl.SSLError) as exc:
            log.warning("metrics certificate reload failed dir=%s error=%r", cert_dir, exc)


# ---------------------------------------------------------------- servers


async def start(
    app: web.Application, address: str, port: int, ctx: ssl.SSLContext | None = None
) -> web.AppRunner:
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    await web.TCPSite(runner, address, port, ssl_context=ctx).start()
    return runner
