"""The Pod manifest carries the same settings as the container flags."""

from __future__ import annotations

import json

import pytest

from kernelbridge.config import SandboxLimits
from kernelbridge.errors import RuntimeUnavailable
from kernelbridge.runtime.base import ContainerSpec
from kernelbridge.runtime.kube.manifest import network_policy, pod_manifest, pod_name, quantity, to_yaml
from kernelbridge.runtime.kube.stream import fuller_tail


def test_quantities_and_names() -> None:
    assert quantity("512m") == "512Mi" and quantity("1g") == "1Gi" and quantity("64k") == "64Ki"
    assert quantity("1000") == "1000"
    assert pod_name("KB_Test.Session-1") == "kb-test-session-1"
    assert len(pod_name("x" * 100)) == 63
    assert pod_name("___") == "kernelbridge-sandbox"


def test_pod_manifest_mirrors_the_container_flags() -> None:
    spec = ContainerSpec(
        image="localhost/kernelbridge-sandbox:abc",
        name="kernelbridge-s1-abc123",
        session="my session/1",
        owner_pid=7,
        env=(("KB", "1"),),
        limits=SandboxLimits(memory="1g", cpus=1.5, tmp_size="32m", workspace_size="128m"),
    )
    pod = pod_manifest(spec, runtime_class="gvisor", namespace="sandboxes")
    meta, body = pod["metadata"], pod["spec"]
    assert meta["name"] == "kernelbridge-s1-abc123" and meta["namespace"] == "sandboxes"
    assert meta["labels"]["kernelbridge.sandbox"] == "true"
    assert meta["labels"]["kernelbridge.session"] == "my_session_1"  # a valid label value ...
    assert meta["annotations"]["kernelbridge.session"] == "my session/1"  # ... the exact one here
    assert body["runtimeClassName"] == "gvisor"
    assert body["automountServiceAccountToken"] is False and body["enableServiceLinks"] is False
    assert body["restartPolicy"] == "Never" and not body["hostNetwork"]
    assert body["securityContext"]["runAsNonRoot"] and body["securityContext"]["runAsUser"] == 65534
    assert body["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = body["containers"]
    assert container["imagePullPolicy"] == "Never" and container["image"] == spec.image
    assert container["stdin"] and container["stdinOnce"] and not container["tty"]
    assert "command" not in container, "no command: the image's CMD (the agent) runs"
    assert {"name": "KB", "value": "1"} in container["env"]
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]} and (sc["runAsUser"], sc["runAsGroup"]) == (65534, 65534)
    assert container["resources"]["limits"] == {"memory": "1Gi", "cpu": "1500m"}
    assert container["resources"]["requests"] == container["resources"]["limits"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v["emptyDir"] for v in body["volumes"]}
    assert volumes[mounts["/tmp"]] == {"medium": "Memory", "sizeLimit": "32Mi"}
    assert volumes[mounts["/workspace"]] == {"medium": "Memory", "sizeLimit": "128Mi"}
    assert container["workingDir"] == "/workspace"


def test_network_policy_denies_everything() -> None:
    policy = network_policy("sandboxes")
    assert policy["spec"]["podSelector"] == {"matchLabels": {"kernelbridge.sandbox": "true"}}
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policy["spec"]["ingress"] == [] and policy["spec"]["egress"] == []


def test_yaml_is_json_documents() -> None:
    text = to_yaml({"a": 1}, {"b": 2})
    assert [json.loads(doc) for doc in text.split("---\n")] == [{"a": 1}, {"b": 2}]


def test_a_durable_pod_has_a_handover_container_of_another_uid_and_a_pod_budget() -> None:
    spec = ContainerSpec(
        image="localhost/kernelbridge-sandbox:abc",
        name="kernelbridge-s1-abc123",
        session="s1",
        owner_pid=7,
        limits=SandboxLimits(memory="512m", cpus=1.0),
        durable=True,
    )
    body = pod_manifest(spec)["spec"]
    sandbox, handover = body["containers"]
    assert {"name": "KERNELBRIDGE_RELAY_UID", "value": "65533"} in sandbox["env"]
    assert sandbox["resources"]["limits"] == {"memory": "512Mi", "cpu": "1000m"}
    sc = handover["securityContext"]
    assert (sc["runAsUser"], sc["runAsNonRoot"], sc["readOnlyRootFilesystem"]) == (65533, True, True)
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["allowPrivilegeEscalation"] is False
    assert "volumeMounts" not in handover and handover["workingDir"] == "/"
    assert {"name": "KERNELBRIDGE_AGENT_PID", "value": "0"} in handover["env"]
    # The pod's budget: the sandbox's cpu, its memory and the handover's; requests = limits.
    assert body["resources"]["limits"] == {"memory": "544Mi", "cpu": "1000m"}
    assert body["resources"]["requests"] == body["resources"]["limits"]
    assert not body.get("shareProcessNamespace"), "kernel code must not see the handover's processes"


def test_the_v5_channel_codec_splits_messages_by_channel() -> None:
    import wsproto
    import wsproto.connection
    import wsproto.events

    from kernelbridge.runtime.kube.stream import ChannelCodec, exit_status

    server = wsproto.connection.Connection(wsproto.ConnectionType.SERVER)
    codec = ChannelCodec()
    wire = server.send(wsproto.events.BytesMessage(data=b"\x01hel", message_finished=False))
    wire += server.send(wsproto.events.BytesMessage(data=b"lo", message_finished=True))
    wire += server.send(wsproto.events.BytesMessage(data=b"\x02oops\n"))
    wire += server.send(wsproto.events.Ping(payload=b"p"))
    pieces, reply = codec.feed(wire)
    assert [(p.channel, p.data) for p in pieces] == [(1, b"hel"), (1, b"lo"), (2, b"oops\n")]
    server.receive_data(reply)
    assert [type(e).__name__ for e in server.events()] == ["Pong"]
    server.receive_data(b"".join(codec.stdin(b"x" * (3 << 20))) + codec.close_stdin())
    sent = [e.data for e in server.events()]
    assert [len(m) for m in sent[:-1]] == [1 + (1 << 20)] * 3, "stdin in 1 MiB messages"
    assert sent[-1] == bytes([255, 0]) and all(m[0] == 0 for m in sent[:-1])
    causes = b'"causes":[{"reason":"ExitCode","message":"3"}]'
    status = b'{"status":"Failure","reason":"NonZeroExitCode","details":{' + causes + b"}}"
    assert exit_status(b'{"status":"Success"}') == (0, "") and exit_status(status)[0] == 3


def test_the_handover_user_the_host_asks_for_is_the_handover_containers() -> None:
    """The host's handover asks every engine for the relay's uid (not root); pods/exec cannot
    choose a user, so the kube backend takes exactly the uid its handover container runs as."""
    from kernelbridge.host.container import HANDOVER_USER
    from kernelbridge.runtime.kube.api import HANDOVER_USERS
    from kernelbridge.runtime.kube.manifest import RELAY_UID

    assert HANDOVER_USER in HANDOVER_USERS  # the handover container runs as RELAY_UID (above)
    assert str(RELAY_UID) in HANDOVER_USERS
    assert "65534" not in HANDOVER_USERS and "1000" not in HANDOVER_USERS


@pytest.mark.anyio
async def test_a_read_on_a_connection_the_server_closed_is_sent_once_more() -> None:
    import httpx2

    from kernelbridge.runtime.kube.api import Api
    from kernelbridge.runtime.kube.connect import ApiConnection

    sent: list[str] = []

    def server(request: httpx2.Request) -> httpx2.Response:
        sent.append(request.method)
        if len(sent) == 1 or request.method != "GET":
            raise httpx2.RemoteProtocolError("Server disconnected without sending a response.")
        return httpx2.Response(200, json={"kind": "Pod"})

    http = httpx2.AsyncClient(base_url="https://cluster.invalid", transport=httpx2.MockTransport(server))
    api = Api(ApiConnection(None, http, "the cluster", "test"))  # type: ignore[arg-type]
    assert await api.json("GET", "/api/v1/pods/p", what="for pod p") == {"kind": "Pod"}
    assert sent == ["GET", "GET"]
    # A write is not sent twice: the server may have acted on it.
    with pytest.raises(RuntimeUnavailable, match="broke off for pod p"):
        await api.json("DELETE", "/api/v1/pods/p", what="for pod p")
    assert sent == ["GET", "GET", "DELETE"]
    await http.aclose()


def test_a_late_attachment_takes_the_logs_fuller_tail_only_when_it_ends_with_what_it_saw() -> None:
    logged = ["line 98", "line 99", "x" * 1000, "the agent failed: bad hello"]
    assert fuller_tail([], logged) == logged
    assert fuller_tail(["the agent failed: bad hello"], logged) == logged
    assert fuller_tail(logged, logged) == logged
    # The log mixes in stdout: one that does not end with the attachment's lines is not its stderr.
    assert fuller_tail(["stderr said this"], ['{"frame": 1}']) == ["stderr said this"]
    assert fuller_tail(["b"], ["a", "b", "c"]) == ["b"]
