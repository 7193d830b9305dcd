"""Engines for the runtime tests: a podman service, a dockerd, a network namespace, TLS files.

Everything here is started bounded and stopped by its owner; nothing touches the host's network
beyond a veth pair numbered from 198.18.0.0/15 (benchmarking space, RFC 2544) into a namespace of
our own. These helpers are synchronous: pytest's session fixtures and teardown run outside any
event loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2

from kernelbridge.config import SandboxLimits
from kernelbridge.runtime.base import ContainerSpec

DOCKER_DIR = Path("/run/kernelbridge-test-docker")
"""The test dockerd's socket, exec root and data root. The data root persists between runs on one
machine so the sandbox image is loaded once (~10 s), not per run."""
START_TIMEOUT = 60.0
"""dockerd answers in ~2 s here; its first start on a fresh data root, or a loaded machine, more."""
STOP_TIMEOUT = 20.0
LOAD_TIMEOUT = 300.0
"""`podman save` + `POST /images/load` of the 0.9 GB sandbox image: 10-35 s each way here."""
POLL = 0.1


def ping(url: str, timeout: float = 2.0, verify: object = None, cert: object = None) -> bool:
    """Whether an engine answers ``GET /_ping`` at ``url`` (``unix:///path`` or ``http(s)://h:p``)."""
    try:
        with engine_http(url, timeout=timeout, verify=verify, cert=cert) as client:
            return client.get("/_ping").status_code == 200
    except (httpx2.HTTPError, OSError):
        return False


def engine_http(url: str, timeout: float = 30.0, verify: object = None, cert: object = None) -> httpx2.Client:
    if url.startswith("unix://"):
        transport = httpx2.HTTPTransport(uds=url.removeprefix("unix://"))
        return httpx2.Client(transport=transport, base_url="http://localhost", timeout=timeout)
    kwargs: dict[str, object] = {}
    if verify is not None:
        kwargs["verify"] = verify
    if cert is not None:
        kwargs["cert"] = cert
    return httpx2.Client(base_url=url, timeout=timeout, **kwargs)  # type: ignore[arg-type]


class Daemon:
    """A background process in its own session, its output in a log file."""

    def __init__(self, argv: list[str], log: Path, netns: str | None = None, cwd: Path | None = None) -> None:
        if netns:
            # nsenter --net, not `ip netns exec`: the latter also remounts /sys for the namespace,
            # which hides /sys/fs/cgroup from the engine ("no cgroup mount found in mountinfo").
            argv = ["nsenter", f"--net=/run/netns/{netns}", "--", *argv]
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = log
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True, cwd=cwd
            )

    def wait_ready(self, ready: object, timeout: float = START_TIMEOUT) -> None:
        """Poll ``ready`` until true; on any failure (even of ``ready`` itself) stop the daemon."""
        deadline = time.monotonic() + timeout
        try:
            while not ready():  # type: ignore[operator]
                if self.process.poll() is not None:
                    raise RuntimeError(f"{self.process.args} exited {self.process.returncode}: {self.tail()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.process.args} not ready within {timeout:g} s: {self.tail()}")
                time.sleep(POLL)
        except BaseException:
            self.stop()
            raise

    def tail(self) -> str:
        return " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-5:])

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(STOP_TIMEOUT)


def start_podman_service(url: str, log: Path, netns: str | None = None) -> Daemon:
    # In the log's directory: conmon drops "oom" marker files into the service's working directory.
    daemon = Daemon(["podman", "system", "service", "--time=0", url], log, netns, cwd=log.parent)
    probe = url if url.startswith("unix://") else url.replace("tcp://", "http://", 1)
    daemon.wait_ready(lambda: ping(probe, timeout=1.0))
    return daemon


def start_dockerd(
    root: Path,
    hosts: list[str],
    *,
    netns: str | None = None,
    tls: Path | None = None,
    probe: str | None = None,
    verify: object = None,
    cert: object = None,
) -> Daemon:
    """dockerd with its own data root, exec root and sockets under ``root``, touching no network
    of the host: no bridge, no iptables rules, no ip_forward sysctl, no masquerading."""
    argv = [
        "dockerd",
        f"--data-root={root / 'data'}",
        f"--exec-root={root / 'exec'}",
        f"--pidfile={root / 'dockerd.pid'}",
        "--bridge=none",
        "--iptables=false",
        "--ip6tables=false",
        "--ip-forward=false",
        "--ip-masq=false",
        "--userland-proxy=false",
        # dockerd looks for daemon.json in /etc/docker by default: ours must not read the host's.
        f"--config-file={root / 'daemon.json'}",
    ]
    (root / "daemon.json").parent.mkdir(parents=True, exist_ok=True)
    (root / "daemon.json").write_text("{}\n")
    argv += [f"--host={h}" for h in hosts]
    if tls:
        argv += [
            "--tlsverify",
            f"--tlscacert={tls / 'ca.pem'}",
            f"--tlscert={tls / 'server-cert.pem'}",
            f"--tlskey={tls / 'server-key.pem'}",
        ]
    daemon = Daemon(argv, root / "dockerd.log", netns)
    target = probe or hosts[0]
    daemon.wait_ready(lambda: ping(target, timeout=1.0, verify=verify, cert=cert))
    return daemon


def load_image(docker_url: str, image: str, work: Path) -> None:
    """Copy ``image`` from podman's store into the engine at ``docker_url`` (docker-archive)."""
    archive = work / "sandbox-image.tar"
    subprocess.run(
        ["podman", "save", "--format", "docker-archive", "-o", str(archive), image],
        check=True,
        timeout=LOAD_TIMEOUT,
        capture_output=True,
    )
    try:
        with engine_http(docker_url, timeout=LOAD_TIMEOUT) as client, archive.open("rb") as body:
            headers = {"Content-Type": "application/x-tar"}
            answer = client.post("/v1.41/images/load", content=body, headers=headers)
            answer.raise_for_status()
            if b'"error"' in answer.content:
                raise RuntimeError(f"docker could not load {image}: {answer.text[:500]}")
    finally:
        archive.unlink(missing_ok=True)


def docker_has_image(docker_url: str, image: str) -> bool:
    with engine_http(docker_url) as client:
        return client.get(f"/v1.41/images/{image}/json").status_code == 200


@dataclass
class NetNs:
    """A network namespace joined to the host by a veth pair on a /30 of 198.18.0.0/15."""

    name: str
    host_if: str
    host_ip: str
    ns_ip: str


@contextlib.contextmanager
def network_namespace(tag: str) -> Iterator[NetNs]:
    # One /30 per process, so parallel test runs on one machine do not collide.
    index = os.getpid() % 32768
    base = (198 << 24) | (18 << 16) | (index * 4)
    ip = lambda n: ".".join(str((base + n) >> s & 255) for s in (24, 16, 8, 0))  # noqa: E731
    ns = NetNs(f"{tag}{os.getpid()}", f"{tag}h{os.getpid()}", ip(1), ip(2))
    peer = f"{tag}n{os.getpid()}"
    steps = [
        ["ip", "netns", "add", ns.name],
        ["ip", "link", "add", ns.host_if, "type", "veth", "peer", "name", peer],
        ["ip", "link", "set", peer, "netns", ns.name],
        ["ip", "addr", "add", f"{ns.host_ip}/30", "dev", ns.host_if],
        ["ip", "link", "set", ns.host_if, "up"],
        ["ip", "-n", ns.name, "addr", "add", f"{ns.ns_ip}/30", "dev", peer],
        ["ip", "-n", ns.name, "link", "set", peer, "up"],
        ["ip", "-n", ns.name, "link", "set", "lo", "up"],
    ]
    try:
        for step in steps:
            subprocess.run(step, check=True, timeout=10, capture_output=True)
        yield ns
    finally:
        # Deleting the host end removes the pair at once; deleting a namespace frees it later.
        subprocess.run(["ip", "link", "del", ns.host_if], timeout=10, capture_output=True)
        subprocess.run(["ip", "netns", "del", ns.name], timeout=10, capture_output=True)


def make_tls(directory: Path, server_ip: str) -> Path:
    """A CA, a server certificate for ``server_ip`` and a client certificate, in docker's file
    names (the client's as ca.pem/cert.pem/key.pem, for DOCKER_CERT_PATH)."""
    directory.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, timeout=30, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca-key.pem", "-out", "ca.pem",
            "-days", "2", "-subj", "/CN=kernelbridge test CA")  # fmt: skip
    (directory / "server.ext").write_text(f"subjectAltName=IP:{server_ip}\nextendedKeyUsage=serverAuth\n")
    (directory / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for who in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{who}-key.pem", "-out", f"{who}.csr",
                "-subj", f"/CN=kernelbridge test {who}")  # fmt: skip
        openssl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem",
                "-CAcreateserial", "-out", f"{who}-cert.pem", "-days", "2",
                "-extfile", f"{who}.ext")  # fmt: skip
    shutil.copy(directory / "client-cert.pem", directory / "cert.pem")
    shutil.copy(directory / "client-key.pem", directory / "key.pem")
    return directory


def tiny_rootfs(tarball: Path) -> Path:
    """A root file system of the host's ``cat``, ``sh`` and ``dd`` and the libraries they load:
    an image of a few MB that imports in a blink (the sandbox image is 0.9 GB)."""
    wanted: set[str] = set()
    for tool in ("/bin/cat", "/bin/sh", "/bin/dd"):
        wanted.add(tool)
        ldd = ["ldd", os.path.realpath(tool)]
        out = subprocess.run(ldd, capture_output=True, text=True, timeout=10).stdout
        wanted.update(word for line in out.splitlines() for word in line.split() if word.startswith("/"))
    added: set[str] = set()

    def add(tar: tarfile.TarFile, path: str) -> None:
        # Resolve the directories (merged /usr: /bin -> usr/bin), keep the file's own symlink.
        entry = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
        if entry in added:
            return
        added.add(entry)
        tar.add(entry, arcname=entry.lstrip("/"), recursive=False)
        if os.path.islink(entry):
            add(tar, os.path.join(os.path.dirname(entry), os.readlink(entry)))

    with tarfile.open(tarball, "w") as tar:
        for top in ("bin", "sbin", "lib", "lib64"):
            if os.path.islink(f"/{top}"):
                tar.add(f"/{top}", arcname=top, recursive=False)
        for name in sorted(wanted):
            add(tar, name)
        for empty in ("tmp", "workspace", "proc", "sys", "dev", "etc"):
            info = tarfile.TarInfo(empty)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if empty in ("tmp", "workspace") else 0o755
            tar.addfile(info)
    return tarball


TEST_RUN_LABEL = "kernelbridge.test-run"
"""Every container a runtime test makes carries this label with the test process's pid: the
fixtures remove exactly these, and never another engineer's containers."""
_names = iter(range(1, 1 << 30))


def make_spec(
    image: str,
    command: tuple[str, ...] = (),
    session: str = "conformance",
    *,
    durable: bool = False,
    **limits: Any,
) -> ContainerSpec:
    return ContainerSpec(
        image=image,
        name=f"kbtest-{os.getpid()}-{next(_names)}-{secrets.token_hex(3)}",
        session=session,
        owner_pid=os.getpid(),
        limits=dataclasses.replace(SandboxLimits(), **limits),
        command=command,
        labels=((TEST_RUN_LABEL, str(os.getpid())),),
        durable=durable,
    )


def unique_image(name: str) -> str:
    """A unique image reference of this test run (``localhost/kbtest-<pid>:<name>``)."""
    return f"localhost/kbtest-{os.getpid()}:{name}-{secrets.token_hex(3)}"


def start_private_podman(directory: Path, netns: str | None = None, url: str | None = None) -> Daemon:
    """A podman service over a storage of its own (no other engineer's containers or images), on
    ``unix://<directory>/p.sock`` or ``url``."""
    url = url or f"unix://{directory}/p.sock"
    argv = [
        "podman",
        f"--root={directory / 'root'}",
        f"--runroot={directory / 'run'}",
        f"--tmpdir={directory / 'tmp'}",
        "system",
        "service",
        "--time=0",
        url,
    ]
    daemon = Daemon(argv, directory / "service.log", netns, cwd=directory)
    probe = url if url.startswith("unix://") else url.replace("tcp://", "http://", 1)
    daemon.wait_ready(lambda: ping(probe, timeout=1.0))
    return daemon


def remove_private_podman(directory: Path) -> None:
    """Remove a private podman's storage. Its overlay home is bind-mounted on itself by every
    podman process that opens the storage, including the ``container cleanup`` processes conmon
    runs after each container's exit, which may come after the service stopped: wait (bounded)
    for them, then unmount and remove."""
    deadline = time.monotonic() + STOP_TIMEOUT
    while _users_of(directory) and time.monotonic() < deadline:
        time.sleep(POLL)
    for _ in range(2):
        for mount in reversed(Path("/proc/self/mounts").read_text().splitlines()):
            target = mount.split()[1]
            if target.startswith(str(directory)):
                subprocess.run(["umount", "-l", target], timeout=10, capture_output=True)
        shutil.rmtree(directory, ignore_errors=True)
        if not directory.exists():
            return


def _users_of(directory: Path) -> list[int]:
    """Processes whose command line names ``directory`` (podman cleanup, conmon)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(directory).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


# What a sandbox sees of its limits, printed as JSON by python3 inside it (cgroup v1 or v2).
LIMITS_PROBE = r"""
import json, os, resource
def read(*paths):
    for p in paths:
        try:
            return open(p).read().strip()
        except OSError:
            pass
try:
    open('/etc/kernelbridge-probe', 'w')
    root_read_only = False
except OSError:
    root_read_only = True
status = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines() if ':' in l)
mounts = {l.split()[1]: l.split()[3].split(',') for l in open('/proc/self/mounts')}
cg = '/sys/fs/cgroup'
print(json.dumps({
    'memory': read(cg + '/memory.max', cg + '/memory/memory.limit_in_bytes'),
    'memory_swap': read(cg + '/memory.swap.max', cg + '/memory/memory.memsw.limit_in_bytes'),
    'pids': read(cg + '/pids.max', cg + '/pids/pids.max'),
    'cpu': read(cg + '/cpu.max')
        or '%s %s' % (read(cg + '/cpu/cpu.cfs_quota_us'), read(cg + '/cpu/cpu.cfs_period_us')),
    'nofile': resource.getrlimit(resource.RLIMIT_NOFILE),
    'nproc': resource.getrlimit(resource.RLIMIT_NPROC),
    'uid': [os.getuid(), os.getgid()], 'pid': os.getpid(), 'cwd': os.getcwd(),
    'tmp': [os.statvfs(d).f_blocks * os.statvfs(d).f_frsize for d in ('/tmp', '/workspace')],
    'tmp_mode': [os.stat(d).st_mode & 0o7777 for d in ('/tmp', '/workspace')],
    'tmp_options': [mounts.get(d, []) for d in ('/tmp', '/workspace')],
    'root_read_only': root_read_only,
    'cap_eff': status['CapEff'].strip(), 'no_new_privs': status['NoNewPrivs'].strip(),
    'interfaces': sorted(os.listdir('/sys/class/net')),
}))
"""


def ssh_keys(directory: Path) -> tuple[Path, Path]:
    """A host key for sshd and a client key authorised to log in as this user."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    host, client = directory / "host_key", directory / "client_key"
    for key in (host, client):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=30
        )
    shutil.copy(directory / "client_key.pub", directory / "authorized_keys")
    return host, client


def start_sshd(directory: Path, address: str, netns: str) -> Daemon:
    """An sshd of our own on ``address``:22 inside ``netns``: key login only, local forwards
    allowed (what ``ssh -L local.sock:remote.sock`` needs), nothing else."""
    host, _ = ssh_keys(directory)
    config = directory / "sshd_config"
    config.write_text(
        f"ListenAddress {address}:22\n"
        f"HostKey {host}\n"
        f"AuthorizedKeysFile {directory / 'authorized_keys'}\n"
        f"PidFile {directory / 'sshd.pid'}\n"
        "PermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "UsePAM no\n"
        "StrictModes no\n"
        "AllowStreamLocalForwarding local\n"
        # Needed too: sshd permits any local forward (a socket path included) only when local
        # TCP forwarding is allowed ("... the request was denied" otherwise).
        "AllowTcpForwarding local\n"
        "X11Forwarding no\n"
    )
    # sshd's privilege-separation directory (created by its package's service unit, which we
    # do not run).
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    daemon = Daemon(["/usr/sbin/sshd", "-D", "-e", "-f", str(config)], directory / "sshd.log", netns)

    def listening() -> bool:
        probe = ["nsenter", f"--net=/run/netns/{netns}", "--", "ss", "-Htln", f"src {address}:22"]
        return bool(subprocess.run(probe, capture_output=True, text=True, timeout=10).stdout.strip())

    daemon.wait_ready(listening)
    return daemon
