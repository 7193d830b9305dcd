"""Reaching a cluster's API server: the credentials, one connection pool, two clients on it.

The REST resources go through **lightkube** (``lightkube.AsyncClient``): a small, typed, async
client built on httpx2, the HTTP stack kernelbridge already uses, that reads kubeconfig files
(client certificates, bearer tokens, exec plugins) and the in-cluster service account, and
re-reads a rotated service-account token. It does not speak ``pods/attach`` as a stream (its
exec is a one-shot call), so the streams (``stream.KubeStream``) are WebSocket upgrades made on
the same httpx2 transport, that is the same connection pool, TLS context and credentials.

Where the credentials come from: ``KUBECONFIG`` (its first file) or ``~/.kube/config`` when
``KUBECONFIG`` is unset and that file exists, else the in-cluster service account
(``/var/run/secrets/kubernetes.io/serviceaccount``, ``KUBERNETES_SERVICE_HOST``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import httpx2
import lightkube
from lightkube.config.client_adapter import user_auth, verify_cluster
from lightkube.config.kubeconfig import KubeConfig, SingleConfig
from lightkube.core.exceptions import ConfigError as LightkubeConfigError

from kernelbridge.errors import RuntimeUnavailable

API_TIMEOUT = 30.0
"""Bound of one API call (the API server answers in milliseconds; past this it is wedged)."""
CONNECT_TIMEOUT = 10.0
KEEPALIVE_CONNECTIONS = 8
FIELD_MANAGER = "kernelbridge"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass
class ApiConnection:
    """One cluster: the REST client (``api``), a plain client for the version and the stream
    upgrades (``http``), both on one transport; ``where`` names the server for messages."""

    api: lightkube.AsyncClient
    http: httpx2.AsyncClient
    where: str
    source: str
    """Where the credentials came from (``KUBECONFIG=/path``, ``in-cluster service account``)."""

    async def aclose(self) -> None:
        await self.api.aclose()
        await self.http.aclose()


def load_config(kubeconfig: Path | None, env: dict[str, str] | None = None) -> tuple[SingleConfig, str]:
    """The cluster, user and default namespace to use, and where they came from.

    Raises RuntimeUnavailable with one line when there is no usable configuration."""
    env = dict(os.environ) if env is None else env
    try:
        if kubeconfig is not None:
            if not kubeconfig.is_file():
                raise RuntimeUnavailable(f"KUBECONFIG={kubeconfig}: no such file")
            return _current(KubeConfig.from_file(kubeconfig), f"KUBECONFIG={kubeconfig}")
        home = Path(env.get("HOME", "~")).expanduser() / ".kube" / "config"
        if home.is_file():
            return _current(KubeConfig.from_file(home), str(home))
        if env.get("KUBERNETES_SERVICE_HOST") and (SERVICE_ACCOUNT / "token").is_file():
            return _current(KubeConfig.from_service_account(), "the in-cluster service account")
    except RuntimeUnavailable:
        raise
    except (LightkubeConfigError, OSError, ValueError, KeyError, TypeError) as exc:
        where = f"KUBECONFIG={kubeconfig}" if kubeconfig else "the kube configuration"
        raise RuntimeUnavailable(f"{where} cannot be used: {' '.join(str(exc).split())[:300]}") from None
    raise RuntimeUnavailable(
        "KERNELBRIDGE_RUNTIME=kube found no cluster: set KUBECONFIG, or run the bridge in a pod "
        "with a service account"
    )


def _current(config: KubeConfig, source: str) -> tuple[SingleConfig, str]:
    single = config.get()
    if single is None:
        raise RuntimeUnavailable(f"{source} has no current context")
    return single, source


def connect(config: SingleConfig, source: str, namespace: str) -> ApiConnection:
    """The clients of ``config`` (no request is made yet). Raises RuntimeUnavailable when its
    certificates cannot be read."""
    if config.user is None:
        raise RuntimeUnavailable(f"{source}: its context names no user")
    try:
        ssl_context = verify_cluster(config.cluster, config.user, config.abs_file)
        auth = user_auth(config.user)
    except (LightkubeConfigError, OSError, ValueError) as exc:
        raise RuntimeUnavailable(f"{source}: its credentials cannot be read: {exc}") from None
    timeout = httpx2.Timeout(API_TIMEOUT, connect=CONNECT_TIMEOUT)
    transport = httpx2.AsyncHTTPTransport(
        verify=ssl_context,
        limits=httpx2.Limits(max_connections=None, max_keepalive_connections=KEEPALIVE_CONNECTIONS),
        # A cluster's address is not the host's proxy's business (as kubectl, which honours
        # proxies only when told; and the streams cannot pass an HTTP proxy).
        trust_env=False,
    )
    server = config.cluster.server
    api = lightkube.AsyncClient(
        config=config,
        namespace=namespace,
        timeout=timeout,
        field_manager=FIELD_MANAGER,
        trust_env=False,
        transport=transport,
    )
    http = httpx2.AsyncClient(
        base_url=server, auth=auth, transport=transport, timeout=timeout, trust_env=False
    )
    return ApiConnection(api, http, f"the Kubernetes API server at {server}", source)
