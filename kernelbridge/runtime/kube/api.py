"""The Kubernetes backend: one sandbox = one Pod, on the same seam as the container engines.

How each verb maps to the API is ``docs/kubernetes.md`` ("Sessions as pods"). Errors are translated
here (``errors.translated``): a missing image is ImageError; a namespace that does not exist,
credentials without a right, a cluster that does not answer are RuntimeUnavailable with one line
naming the API server.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Sequence
from typing import Any, cast
from urllib.parse import urlencode

import anyio
import anyio.abc
import httpx2
from lightkube.resources.core_v1 import Pod

from kernelbridge.errors import ImageError, RuntimeUnavailable
from kernelbridge.runtime.base import (
    SESSION_LABEL,
    ContainerInfo,
    ContainerSpec,
    ContainerState,
    ContainerStream,
    RuntimeBackend,
    RuntimeInfo,
)
from kernelbridge.runtime.engine.stream import StderrTail
from kernelbridge.runtime.kube.connect import API_TIMEOUT, ApiConnection
from kernelbridge.runtime.kube.errors import ClusterRefused, refused, status_message, translated
from kernelbridge.runtime.kube.images import HOW_TO_LOAD, KubeImages
from kernelbridge.runtime.kube.lease import Leases
from kernelbridge.runtime.kube.manifest import (
    CONTAINER_NAME,
    HANDOVER_CONTAINER,
    RELAY_UID,
    label_value,
    pod_manifest,
    pod_name,
)
from kernelbridge.runtime.kube.pods import container_info, pending_reason, sandbox_status
from kernelbridge.runtime.kube.stream import SUBPROTOCOL, EndedStream, KubeStream

log = logging.getLogger(__name__)

HANDOVER_USERS = frozenset({"0", str(RELAY_UID), f"{RELAY_UID}:{RELAY_UID}"})
"""The users ``attach_exec`` can run as: the handover container's uid, however it is spelt."""

START_WAIT = 120.0
"""Bound of waiting for a pod's container to run: scheduling (a full node makes a pod wait for
room), the pod's sandbox and network, the container. 2 s here; minutes mean it will not."""
REMOVE_WAIT = 30.0
"""Bound of waiting for a deleted pod to be gone (about 2 s here)."""
ENDED_WAIT = 10.0
"""How long the kubelet may take to report a container that ended (its status sync: ~1 s)."""
DELETE_GRACE = 1
POLL = 0.1
LOG_ENTRIES = 1000
"""The log entries asked for (``tailLines``), for the 40 lines kept (``StderrTail``): the node's
log holds a long line as several partial entries, one per read of the container's pipe (16 KiB
at most, fewer bytes on a busy node), and the kubelet counts entries: that is the likely reason a
100 kB line once left no room in 40 entries for the lines before it (CI, 3 workers)."""
LOG_BYTES = 4 << 20
IMAGE_WAITING = {"ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff", "InvalidImageName"}
BROKEN_WAITING = {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}


class Api:
    """Raw JSON calls to the API server (what lightkube's typed models do not fit: Leases, whose
    ``MicroTime`` it writes without the six fraction digits the server requires; conditional
    merge patches; the nodes' image lists), bounded and translated."""

    def __init__(self, conn: ApiConnection) -> None:
        self.conn = conn

    async def json(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        merge: bool = False,
        what: str,
        query: dict[str, str] | None = None,
        timeout: float = API_TIMEOUT,
    ) -> Any:
        headers = {"Content-Type": "application/merge-patch+json" if merge else "application/json"}
        content = json.dumps(body).encode() if body is not None else None
        with translated(self.conn.where, what, timeout):
            try:
                response = await self.conn.http.request(
                    method, path, content=content, headers=headers, params=query
                )
            except httpx2.RemoteProtocolError:
                # A kept-alive connection that the server closed as the request went out ("Server
                # disconnected without sending a response"; httpx retries only connects): a read
                # is sent once more, on a new connection.
                if method != "GET":
                    raise
                response = await self.conn.http.request(method, path, headers=headers, params=query)
        if response.status_code >= 400:
            message, reason = status_message(response.content)
            raise refused(self.conn.where, what, response.status_code, message, reason)
        return response.json() if response.content.strip() else None


class KubeRuntime(RuntimeBackend):
    """Sandboxes as pods of ``namespace`` (see the module docstring). Enter it (``async with``)
    to renew the Leases it holds; build it with :func:`kube.open_kube`."""

    def __init__(
        self,
        conn: ApiConnection,
        *,
        namespace: str,
        runtime_class: str | None = None,
        version: str = "",
        images: KubeImages | None = None,
    ) -> None:
        self.conn = conn
        self.api = Api(conn)
        self.namespace = namespace
        self.runtime_class = runtime_class
        self.version = version
        self.name = "kube"
        self.engine = "kubernetes"
        self.images = images or KubeImages(self.api, namespace, None, ())
        self.leases = Leases(self.api, namespace)
        self._images_seen: set[str] = set()
        """Images a node was seen to hold (asked once each)."""
        self._removed: set[str] = set()
        self._unattached: set[str] = set()
        """Pods made here and not attached to yet: only their first attach may find them ended
        (a command that failed at once) and still hand back a stream, with their log's tail."""
        self._tg: anyio.abc.TaskGroup | None = None

    def __repr__(self) -> str:
        return f"<KubeRuntime {self.namespace} at {self.conn.where}>"

    @property
    def endpoint(self) -> str:
        return str(self.conn.http.base_url).rstrip("/")

    async def __aenter__(self) -> KubeRuntime:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self.leases.keep)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._tg is not None:
            self._tg.cancel_scope.cancel()
            await self._tg.__aexit__(None, None, None)
            self._tg = None
        await self.aclose()

    def _pods(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods"

    # -- containers ---------------------------------------------------------------------------------
    async def create(self, spec: ContainerSpec) -> str:
        await self._check_image(spec.image)
        manifest = pod_manifest(spec, runtime_class=self.runtime_class, namespace=self.namespace)
        name = manifest["metadata"]["name"]
        with translated(self.conn.where, f"to create pod {name}", API_TIMEOUT):
            try:
                created = await self.conn.api.create(cast(Pod, Pod.from_dict(manifest)))
            except Exception as exc:
                raise self._create_refused(exc, name) from None
        self._removed.discard(name)
        self._unattached.add(name)
        if spec.durable:
            pod = created.to_dict()
            try:
                await self.leases.create(pod, manifest["metadata"]["labels"])
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await self.remove([name])
                raise
        return str(name)

    def _create_refused(self, exc: Exception, name: str) -> Exception:
        from lightkube import ApiError

        if not isinstance(exc, ApiError):
            return exc
        status = exc.status
        code, message = int(status.code or 0), " ".join((status.message or "").split())
        if code == 404 and "namespaces" in message:
            return RuntimeUnavailable(
                f"the namespace {self.namespace!r} does not exist on {self.conn.where} "
                "(KERNELBRIDGE_KUBE_NAMESPACE; kubectl create namespace it, with pod security restricted)"
            )
        return refused(self.conn.where, f"to create pod {name}", code, message[:300], status.reason or "")

    async def _check_image(self, image: str) -> None:
        """ImageError when the nodes say none holds ``image`` (nothing is pulled: imagePullPolicy
        Never); where nodes cannot be read, the pod's ``ErrImageNeverPull`` says it at attach."""
        if image in self._images_seen:
            return
        present = await self.images.on_nodes()
        if present is None:
            return
        if image not in present and await self.images.labels(image) is None:
            raise ImageError(
                f"the sandbox image {image} is missing on the nodes of {self.conn.where}; "
                f"run `kernelbridge image build` and {HOW_TO_LOAD}"
            )
        self._images_seen.add(image)

    async def attach(self, container: str) -> ContainerStream:
        name = pod_name(container)
        first = name in self._unattached
        self._unattached.discard(name)
        pod = await self._wait_running(name)
        if pod is None:
            if not first:
                raise RuntimeUnavailable(f"cannot attach to {name}: it has ended; it is not started again")
            # Made here and never attached to: it failed at once, and its log says why.
            return EndedStream(await self._log_tail(name))
        try:
            return await self._stream(
                name, "attach", {"container": CONTAINER_NAME}, durable=self._durable(pod)
            )
        except RuntimeUnavailable:
            # It ended between the look and the attachment (the kubelet says so a moment later):
            # what it said is in its log.
            if first and await self._ended(name):
                return EndedStream(await self._log_tail(name))
            raise

    async def _ended(self, name: str) -> bool:
        """Whether the pod's sandbox container has ended, asked until the kubelet says (bounded)."""
        with anyio.move_on_after(ENDED_WAIT):
            while True:
                info = await self.inspect(name)
                if info is None or info.state is ContainerState.EXITED:
                    return info is not None
                await anyio.sleep(POLL)
        return False

    async def _wait_running(self, name: str) -> dict[str, Any] | None:
        """The pod once its sandbox container runs; None if that container has ended (it is not
        run again). Raises ImageError (the image is not on the node: the pod is removed),
        RuntimeUnavailable (gone, cannot start, no room within :data:`START_WAIT`)."""
        deadline = time.monotonic() + START_WAIT
        while True:
            pod = await self._get(name)
            if pod is None:
                raise RuntimeUnavailable(f"cannot attach to {name}: the pod does not exist")
            if (pod.get("metadata") or {}).get("deletionTimestamp"):
                raise RuntimeUnavailable(f"cannot attach to {name}: the pod is being deleted")
            state = sandbox_status(pod).get("state") or {}
            if "running" in state:
                return pod
            if "terminated" in state or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                return None
            waiting = state.get("waiting") or {}
            reason = str(waiting.get("reason") or "")
            if reason in IMAGE_WAITING:
                image = (pod.get("spec") or {}).get("containers", [{}])[0].get("image", "?")
                with anyio.CancelScope(shield=True):
                    await self.remove([name])
                raise ImageError(
                    f"the sandbox image {image} is missing on the node ({reason}); "
                    f"run `kernelbridge image build` and {HOW_TO_LOAD}"
                )
            if reason in BROKEN_WAITING:
                said = " ".join(str(waiting.get("message") or reason).split())[:300]
                raise RuntimeUnavailable(f"the pod {name} cannot start its container: {said}")
            if time.monotonic() > deadline:
                raise RuntimeUnavailable(
                    f"the pod {name} did not start within {START_WAIT:g} s: {pending_reason(pod)}"
                )
            await anyio.sleep(POLL)

    async def attach_exec(
        self,
        container: str,
        command: Sequence[str],
        *,
        user: str = "0",
        workdir: str = "/",
        env: Sequence[tuple[str, str]] = (),
    ) -> ContainerStream:
        """Run ``command`` in the pod's handover container, as its own uid (the relay's,
        :data:`RELAY_UID`: neither the kernel's nor root): pods/exec runs as the container's uid,
        so ``user`` may name that uid (``65533`` or ``65533:65533``, what the host's handover
        asks every engine for) or ``0`` (the handover's, whatever its uid), and nothing else.
        pods/exec has no working directory either: the handover container's
        is ``/``, and another ``workdir`` is set by ``env -C`` (coreutils >= 8.28, in the image)
        in that container, where nothing of the sandbox's can be written or put on its PATH; so is
        ``env`` (``env NAME=VALUE``: pods/exec has no environment of its own)."""
        name = pod_name(container)
        if user not in HANDOVER_USERS:
            raise RuntimeUnavailable(
                f"pods/exec cannot run as user {user}: only the handover container's"
                f" ({RELAY_UID}) is supported"
            )
        pod = await self._get(name)
        if pod is None:
            raise RuntimeUnavailable(f"cannot attach to {name} again: it does not exist")
        if "running" not in (sandbox_status(pod).get("state") or {}):
            raise RuntimeUnavailable(f"cannot attach to {name} again: it is not running")
        if not self._durable(pod):
            raise RuntimeUnavailable(f"cannot attach to {name} again: it is not a durable sandbox")
        argv = list(command)
        if (workdir and workdir != "/") or env:
            where = ["-C", workdir] if workdir and workdir != "/" else []
            # `--` ends env's options; the assignments come after it (before them, env would run
            # `--` as the command).
            argv = ["env", *where, "--", *(f"{key}={value}" for key, value in env), *argv]
        await self.leases.hold(name)
        query = {"container": HANDOVER_CONTAINER, "command": argv}
        try:
            return await self._stream(name, "exec", query, durable=True)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.leases.release(name)
            raise

    def _durable(self, pod: dict[str, Any]) -> bool:
        containers = (pod.get("spec") or {}).get("containers") or []
        return any(c.get("name") == HANDOVER_CONTAINER for c in containers)

    async def _stream(self, name: str, kind: str, query: dict[str, Any], *, durable: bool) -> KubeStream:
        params: list[tuple[str, str]] = [("stdin", "true"), ("stdout", "true"), ("stderr", "true")]
        for key, value in query.items():
            params += [(key, v) for v in value] if isinstance(value, list) else [(key, value)]
        url = f"{self._pods()}/{name}/{kind}?{urlencode(params)}"
        headers = {
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": base64.b64encode(secrets.token_bytes(16)).decode(),
            "Sec-WebSocket-Protocol": SUBPROTOCOL,
        }
        what = f"to {kind} to {name}" if kind == "attach" else f"to run {query['command'][0]} in {name}"
        http = self.conn.http
        with translated(self.conn.where, what, API_TIMEOUT):
            response = await http.send(http.build_request("GET", url, headers=headers), stream=True)
            if response.status_code != 101:
                try:
                    body = await response.aread()
                finally:
                    await response.aclose()
                message, reason = status_message(body)
                raise refused(self.conn.where, what, response.status_code, message, reason)
        if response.headers.get("sec-websocket-protocol") != SUBPROTOCOL:
            await response.aclose()
            raise RuntimeUnavailable(
                f"{self.conn.where} does not speak {SUBPROTOCOL} (Kubernetes >= 1.30 does) {what}"
            )
        on_close = (lambda: self.leases.release(name)) if durable else None
        log_tail = (lambda: self._log_tail(name)) if kind == "attach" else None
        network = response.extensions["network_stream"]
        return LeasedStream(response, network, on_close=on_close, log_tail=log_tail)

    async def _log_tail(self, name: str) -> list[str]:
        """The last lines of the sandbox container's log (its stdout and stderr together: the
        agent writes nothing to stdout before it is spoken to)."""
        query = {"container": CONTAINER_NAME, "tailLines": str(LOG_ENTRIES)}
        tail = StderrTail()
        read = 0
        try:
            with translated(self.conn.where, f"for the log of {name}", API_TIMEOUT):
                url = f"{self._pods()}/{name}/log"
                async with self.conn.http.stream("GET", url, params=query) as response:
                    if response.status_code >= 400:
                        return []
                    # A line may be megabytes: read a bounded amount.
                    async for chunk in response.aiter_bytes():
                        tail.feed(chunk)
                        read += len(chunk)
                        if read > LOG_BYTES:
                            break
        except RuntimeUnavailable:
            return []
        return tail.lines()

    async def remove(self, containers: list[str]) -> None:
        names = list(dict.fromkeys(pod_name(c) for c in containers))
        self._removed.update(names)
        async with anyio.create_task_group() as tg:
            for name in names:
                tg.start_soon(self._remove_one, name)

    async def _remove_one(self, name: str) -> None:
        self.leases.forget(name)
        with contextlib.suppress(ClusterRefused):  # gone already, or GC'd with its pod
            await self.api.json("DELETE", self.leases.path(name), what=f"to delete the Lease of {name}")
        query = {"gracePeriodSeconds": str(DELETE_GRACE)}
        try:
            await self.api.json("DELETE", f"{self._pods()}/{name}", query=query, what=f"to delete pod {name}")
        except ClusterRefused as exc:
            if exc.status == 404:
                return
            raise
        # Polled: the API server has no event to wait on but a watch, and this takes ~2 s.
        with anyio.move_on_after(REMOVE_WAIT):
            while await self._get(name) is not None:  # noqa: ASYNC110
                await anyio.sleep(POLL * 2)

    async def _get(self, name: str) -> dict[str, Any] | None:
        try:
            pod = await self.api.json("GET", f"{self._pods()}/{name}", what=f"for pod {name}")
        except ClusterRefused as exc:
            if exc.status == 404:
                return None
            raise
        return pod if isinstance(pod, dict) else None

    async def inspect(self, container: str) -> ContainerInfo | None:
        pod = await self._get(pod_name(container))
        return None if pod is None else container_info(pod)

    async def list(self, labels: dict[str, str] | None = None) -> list[ContainerInfo]:
        wanted = labels if labels is not None else {SESSION_LABEL: ""}
        selector = ",".join(f"{k}={label_value(v)}" if v else k for k, v in wanted.items())
        found = await self.api.json(
            "GET", self._pods(), query={"labelSelector": selector} if selector else None, what="to list pods"
        )
        return [container_info(pod) for pod in (found or {}).get("items") or [] if isinstance(pod, dict)]

    # -- the cluster ---------------------------------------------------------------------------------
    async def info(self) -> RuntimeInfo:
        version = await self.api.json("GET", "/version", what="for its version")
        return RuntimeInfo(
            name=self.name,
            engine=self.engine,
            version=str((version or {}).get("gitVersion") or self.version),
            endpoint=self.endpoint,
            oci_runtime=self.runtime_class or "",
            # The kubelet enforces the pod's requests = limits (and podPidsLimit, a node setting).
            limits_enforced=True,
            reattach=True,
        )

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            for name in list(self.leases.held):
                with anyio.move_on_after(5.0), contextlib.suppress(RuntimeUnavailable):
                    await self.leases.release(name)
            await self.conn.aclose()


class LeasedStream(KubeStream):
    """A pod's stream whose end lets go of the pod's Lease (a durable pod's)."""

    def __init__(self, response: httpx2.Response, network: Any, *, on_close: Any, log_tail: Any) -> None:
        super().__init__(response, network, log_tail=log_tail)
        self._on_close = on_close

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            on_close, self._on_close = self._on_close, None
            if on_close is not None:
                with anyio.CancelScope(shield=True), anyio.move_on_after(5.0):
                    with contextlib.suppress(RuntimeUnavailable):
                        await on_close()
