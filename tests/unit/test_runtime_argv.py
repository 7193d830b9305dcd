"""The CLI backend's create argv carries every hardening flag of DESIGN.md, each configurable."""

from __future__ import annotations

import itertools

from kernelbridge.config import SandboxLimits
from kernelbridge.runtime import ContainerSpec, ContainerState
from kernelbridge.runtime.cli.backend import CliRuntime, parse_ps_output


def spec(**limits: object) -> ContainerSpec:
    return ContainerSpec(
        image="img:1", name="kernelbridge-s-abc", session="s", owner_pid=42, limits=SandboxLimits(**limits)
    )


def pairs(argv: list[str]) -> set[tuple[str, str]]:
    return set(itertools.pairwise(argv))


def test_podman_argv_has_the_design_flags() -> None:
    argv = CliRuntime("podman", "/usr/bin/podman", oci_runtime="runc").create_argv(spec())
    assert argv[:2] == ["/usr/bin/podman", "create"]
    for flag in ("--interactive", "--read-only"):
        assert flag in argv
    # No init process: it would hold the frame pipes where kernel code could reach them.
    assert "--init" not in argv and "--rm" not in argv
    expected = {
        ("--network", "none"),
        ("--cap-drop", "ALL"),
        ("--security-opt", "no-new-privileges"),
        ("--user", "65534:65534"),
        ("--memory", "512m"),
        ("--memory-swap", "512m"),
        ("--pids-limit", "128"),
        ("--cpus", "1"),
        ("--workdir", "/workspace"),
        ("--label", "kernelbridge.session=s"),
        ("--label", "kernelbridge.owner=42"),
        ("--name", "kernelbridge-s-abc"),
        ("--log-driver", "none"),
        ("--runtime", "runc"),
        ("--ulimit", "nofile=1024:1024"),
        ("--pull", "never"),
    }
    assert expected <= pairs(argv)
    assert any(a.startswith("/tmp:") and "size=64m" in a for a in argv)
    assert any(a.startswith("/workspace:") and "size=256m" in a for a in argv)
    assert argv[-1] == "img:1"


def test_limits_are_configurable() -> None:
    argv = CliRuntime().create_argv(
        spec(memory="1g", pids=64, cpus=0.5, read_only=False, network="slirp4netns")
    )
    assert {("--memory", "1g"), ("--memory-swap", "1g"), ("--pids-limit", "64"), ("--cpus", "0.5")} <= pairs(
        argv
    )
    assert ("--network", "slirp4netns") in pairs(argv)
    assert "--read-only" not in argv


def test_docker_does_not_get_podman_only_flags() -> None:
    argv = CliRuntime("docker", "docker").create_argv(spec())
    assert ("--log-driver", "none") in pairs(argv)
    assert "--runtime" not in argv
    assert any(a.startswith("/tmp:") for a in argv)  # docker's --read-only leaves /tmp read-only


def test_ps_output_of_both_runtimes() -> None:
    podman = '[{"Id": "abc", "Names": ["kb-1"], "Labels": {"kernelbridge.owner": "7"}, "State": "running"}]'
    docker = (
        '{"ID": "def", "Names": "kb-2", "State": "exited",'
        ' "Labels": "kernelbridge.owner=8,kernelbridge.session=s"}'
    )
    [p] = parse_ps_output(podman)
    [d] = parse_ps_output(docker)
    assert (p.name, p.owner_pid, d.name, d.owner_pid) == ("kb-1", 7, "kb-2", 8)
    assert (p.state, d.state) == (ContainerState.RUNNING, ContainerState.EXITED)
    assert parse_ps_output("") == []
