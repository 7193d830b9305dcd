"""The Pod manifest carries the same settings as the container flags."""

from __future__ import annotations

import json

from kernelbridge.config import SandboxLimits
from kernelbridge.runtime.base import ContainerSpec
from kernelbridge.runtime.kube.manifest import network_policy, pod_manifest, pod_name, quantity, to_yaml


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
