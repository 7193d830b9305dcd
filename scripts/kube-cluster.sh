#!/usr/bin/env bash
# A real single-node Kubernetes cluster for kernelbridge's kube tier, built and run by the project
# itself (no kind, no k3s, no registry):
#
#   scripts/kube-cluster.sh build          build the binaries once (cached outside the checkout)
#   scripts/kube-cluster.sh built          exit 0 when they are built (and current)
#   scripts/kube-cluster.sh up             build if needed, start it, wait for the node; the last
#                                          line printed is KUBECONFIG=<path>
#   scripts/kube-cluster.sh kubectl ARGS   the cluster's kubectl with its admin kubeconfig
#   scripts/kube-cluster.sh import IMAGE   copy an image from podman's store into the node, and
#                                          record a sandbox image's labels for the kube backend
#   scripts/kube-cluster.sh status         which of its processes run
#   scripts/kube-cluster.sh down [--purge] stop it and leave nothing running or mounted; --purge
#                                          also removes its directory (PKI, datastore, images)
#
# The parts: kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kubectl of one
# pinned release, built from the Go module proxy (scripts/kube/k8s/go.mod); kine on SQLite as the
# datastore (scripts/kube/kine/go.mod); Debian's containerd and runc as the CRI, with their own
# config, root, state and socket; a pause image of our own (scripts/kube/pause). No kube-proxy,
# no DNS: sandbox pods get no network at all (docs/kubernetes.md, "The development cluster").
#
# Environment: KERNELBRIDGE_KUBE_DIR (everything it runs and writes; default
# ~/.local/state/kernelbridge/kube), KERNELBRIDGE_KUBE_CACHE (the built binaries, by version;
# default ~/.cache/kernelbridge/kube), KERNELBRIDGE_KUBE_IMAGE (the sandbox image to import on
# `up`; default the checkout's current one, when .venv exists), KERNELBRIDGE_KUBE_PORT (the API
# server's port, default 16443). Root only: the kubelet and containerd need it.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODULES=$REPO/scripts/kube

K8S_VERSION=v1.37.2
KINE_VERSION=v0.17.5
CACHE=${KERNELBRIDGE_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kernelbridge/kube}
BIN=$CACHE/$K8S_VERSION
DIR=${KERNELBRIDGE_KUBE_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/kernelbridge/kube}

# Addresses: the node's own (API server, kubelet) on a port-less bridge of the host, in the
# benchmarking range 198.18.0.0/15 that no real network uses; the service and pod ranges beside it.
NODE_LINK=kbkube0
NODE_IP=198.18.255.1
NULL_LINK=kbkube-null
SERVICE_CIDR=198.18.254.0/24
SERVICE_IP=198.18.254.1
SANDBOX_POD_CIDR=198.19.0.0/17
NODE_POD_CIDR=198.19.128.0/17
NODE_NETWORK_CLASS=kernelbridge-node-network
API_PORT=${KERNELBRIDGE_KUBE_PORT:-16443}
KUBELET_PORT=$((API_PORT + 7))
NODE_NAME=kernelbridge-node
PAUSE_IMAGE=localhost/kernelbridge-pause:$K8S_VERSION
SANDBOX_NAMESPACE=kernelbridge
CGROUP_ROOT=/kernelbridge-kube

CTRD_SOCK=$DIR/containerd/containerd.sock
KINE_SOCK=$DIR/kine/kine.sock
KUBECONFIG_ADMIN=$DIR/admin.kubeconfig
COMPONENTS=(kine containerd kube-apiserver kube-controller-manager kube-scheduler kubelet)
START_TIMEOUT=${KERNELBRIDGE_KUBE_START_TIMEOUT:-180}
STOP_TIMEOUT=15

say() { printf 'kube-cluster: %s\n' "$*" >&2; }
die() {
    say "$*"
    exit 1
}
now() { date +%s.%N; }
since() { awk -v now="$(now)" -v start="$1" 'BEGIN { printf "%.1f", now - start }'; }

# -- build -----------------------------------------------------------------------------------------------

# What the cached binaries were built from: a change to a wrapper module rebuilds them.
build_stamp() {
    cat "$MODULES"/*/go.mod "$MODULES"/*/go.sum "$MODULES"/pause/*.go 2>/dev/null |
        grep -v '^$' | sha256sum | cut -c1-16
}

version_ldflags() {  # the flags hack/lib/version.sh sets in a release build
    local flags="" key number=${K8S_VERSION#v}
    for key in "gitVersion=$K8S_VERSION" "gitMajor=${number%%.*}" "gitMinor=$(cut -d. -f2 <<<"$number")" \
        "gitTreeState=clean" "buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"; do
        flags+=" -X k8s.io/component-base/version.$key -X k8s.io/client-go/pkg/version.$key"
    done
    echo "$flags"
}

build() {
    local stamp
    stamp=$(build_stamp)
    if [[ -f $BIN/.stamp && $(cat "$BIN/.stamp") == "$stamp" ]]; then
        return 0
    fi
    command -v go >/dev/null || die "go is not installed (Go >= 1.26 builds the cluster)"
    command -v gcc >/dev/null || die "gcc is not installed (kine's SQLite is C, built through cgo)"
    local out=$BIN.partial started
    started=$(now)
    rm -rf "$out" && mkdir -p "$out"
    say "building Kubernetes $K8S_VERSION, kine $KINE_VERSION and the pause image into $BIN"
    say "(the first build takes about half an hour on 2 cores; later ones reuse Go's build cache)"
    (
        cd "$MODULES/k8s"
        # Static and stripped, with the tags of a release build (hack/lib/golang.sh).
        CGO_ENABLED=0 nice -n 10 go build -trimpath -tags selinux,notest,grpcnotrace \
            -ldflags "-s -w $(version_ldflags)" -o "$out/" \
            k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
            k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl
    )
    (
        cd "$MODULES/kine"
        # SQLite through cgo, with the options of kine's own release build (scripts/build there).
        CGO_ENABLED=1 nice -n 10 go build -trimpath \
            -tags sqlite_unlock_notify,sqlite_vtable,sqlite_stat4,sqlite_math_functions,sqlite_dbstat \
            -ldflags "-s -w -X github.com/k3s-io/kine/pkg/version.Version=$KINE_VERSION" \
            -o "$out/kine" github.com/k3s-io/kine
    )
    (cd "$MODULES/pause" && CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags '-s -w' -o "$out/pause" .)
    pause_archive "$out/pause" "$out/pause.tar"
    echo "$stamp" >"$out/.stamp"
    rm -rf "$BIN" && mv "$out" "$BIN"
    say "built in $(since "$started") s"
}

# A docker-archive image of the pause binary alone, for `ctr images import`.
pause_archive() {
    local binary=$1 archive=$2 work diff config_sha
    work=$(mktemp -d)
    mkdir -p "$work/rootfs"
    cp "$binary" "$work/rootfs/pause"
    tar -C "$work/rootfs" --owner=0 --group=0 --mtime=@0 -cf "$work/layer.tar" pause
    diff=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
    printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/pause"],"User":"65535:65535"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
        "$diff" >"$work/config.json"
    config_sha=$(sha256sum "$work/config.json" | cut -d' ' -f1)
    mv "$work/config.json" "$work/$config_sha.json"
    printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["layer.tar"]}]' "$config_sha" "$PAUSE_IMAGE" \
        >"$work/manifest.json"
    tar -C "$work" --owner=0 --group=0 --mtime=@0 -cf "$archive" manifest.json "$config_sha.json" layer.tar
    rm -rf "$work"
}

# -- host packages ---------------------------------------------------------------------------------------

ensure_packages() {
    local missing=()
    command -v containerd >/dev/null || missing+=(containerd)
    command -v runc >/dev/null || missing+=(runc)
    [[ -x /usr/lib/cni/macvlan && -x /usr/lib/cni/host-local ]] || missing+=(containernetworking-plugins)
    command -v openssl >/dev/null || missing+=(openssl)
    ((${#missing[@]})) || return 0
    say "installing ${missing[*]} ..."
    export DEBIAN_FRONTEND=noninteractive
    # Keep package scripts from starting a system containerd (this cluster runs its own).
    local no_policy=0
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        no_policy=1
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
    fi
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
    if ((no_policy)); then rm -f /usr/sbin/policy-rc.d; fi
}

# -- PKI and kubeconfigs ---------------------------------------------------------------------------------

sign() {  # sign NAME SUBJECT [SUBJECT_ALT_NAMES]: a key and a certificate signed by the cluster's CA
    local name=$1 subject=$2 sans=${3:-} pki=$DIR/pki
    [[ -f $pki/$name.crt ]] && return 0
    openssl req -newkey rsa:2048 -nodes -keyout "$pki/$name.key" -subj "$subject" -out "$pki/$name.csr" 2>/dev/null
    local ext="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=${sans:+serverAuth,}clientAuth"
    [[ -n $sans ]] && ext+=$'\n'"subjectAltName=$sans"
    openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
        -days 3650 -sha256 -extfile <(echo "$ext") -out "$pki/$name.crt" 2>/dev/null
    rm -f "$pki/$name.csr"
}

kubeconfig() {  # kubeconfig FILE CERT_NAME
    cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kernelbridge
  cluster:
    certificate-authority: $DIR/pki/ca.crt
    server: https://$NODE_IP:$API_PORT
users:
- name: $2
  user:
    client-certificate: $DIR/pki/$2.crt
    client-key: $DIR/pki/$2.key
contexts:
- name: kernelbridge
  context: {cluster: kernelbridge, user: $2}
current-context: kernelbridge
EOF
}

write_pki() {
    local pki=$DIR/pki
    mkdir -p "$pki" && chmod 700 "$pki"
    if [[ ! -f $pki/ca.crt ]]; then
        openssl req -x509 -newkey rsa:2048 -nodes -keyout "$pki/ca.key" -subj "/CN=kernelbridge-kube-ca" \
            -days 3650 -sha256 -addext "keyUsage=critical,keyCertSign,cRLSign" -out "$pki/ca.crt" 2>/dev/null
    fi
    sign apiserver "/CN=kube-apiserver" \
        "IP:$NODE_IP,IP:$SERVICE_IP,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost"
    sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
    sign admin "/O=system:masters/CN=kernelbridge-admin"
    sign controller-manager "/CN=system:kube-controller-manager"
    sign scheduler "/CN=system:kube-scheduler"
    sign kubelet-client "/O=system:nodes/CN=system:node:$NODE_NAME"
    sign kubelet "/CN=$NODE_NAME" "IP:$NODE_IP,DNS:$NODE_NAME"
    if [[ ! -f $pki/sa.key ]]; then
        openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$pki/sa.key" 2>/dev/null
        openssl pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
    fi
    kubeconfig "$KUBECONFIG_ADMIN" admin
    kubeconfig "$DIR/controller-manager.kubeconfig" controller-manager
    kubeconfig "$DIR/scheduler.kubeconfig" scheduler
    kubeconfig "$DIR/kubelet.kubeconfig" kubelet-client
}

# -- configuration files ---------------------------------------------------------------------------------

write_containerd_config() {
    mkdir -p "$DIR/containerd" "$DIR/cni/net.d" "$DIR/cni/net.d-node" "$DIR/cni/ipam"
    # The sandbox's ulimits have no Pod field: they are the runtime's defaults. containerd's own
    # default spec has nofile 1024 and no nproc, and the CRI would pass on containerd's limits
    # without a base spec; these are the sandbox's (SandboxLimits.nofile/nproc).
    ctr oci spec | python3 -c '
import json, sys
spec = json.load(sys.stdin)
spec["process"]["rlimits"] = [
    {"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024},
    {"type": "RLIMIT_NPROC", "hard": 4096, "soft": 4096},
]
json.dump(spec, sys.stdout, indent=2)
' >"$DIR/containerd/base-spec.json"
    cat >"$DIR/containerd/config.toml" <<EOF
version = 2
root = "$DIR/containerd/root"
state = "$DIR/containerd/state"
# Snapshotters the node does not use would only probe the host's file systems.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "$CTRD_SOCK"
[ttrpc]
  address = "$CTRD_SOCK.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "$DIR/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # Pod network namespaces under this cluster's state directory, not the host's /run/netns.
  netns_mounts_under_state_dir = true
  # Root here has no CAP_SYS_RESOURCE, so the pause process's oom_score_adj of -998 fails
  # ("nsexec: failed to update /proc/self/oom_score_adj: Permission denied"): keep every
  # container's at or above containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      base_runtime_spec = "$DIR/containerd/base-spec.json"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # cgroup v1 (hybrid) host: cgroupfs, as the kubelet's cgroupDriver.
        SystemdCgroup = false
    # The same runc with the node network (RuntimeClass $NODE_NETWORK_CLASS), for the bridge's
    # own pod: it must reach the API server; sandbox pods never get it (an admission policy).
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc-node-network]
      runtime_type = "io.containerd.runc.v2"
      base_runtime_spec = "$DIR/containerd/base-spec.json"
      cni_conf_dir = "$DIR/cni/net.d-node"
      cni_max_conf_num = 1
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc-node-network.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$DIR/cni/net.d"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = ""
EOF
    # The pod "network": containerd needs an eth0 with an address in each pod, so each pod gets a
    # macvlan in private mode on a bridge with no ports and no address (NULL_LINK). Private mode
    # keeps macvlans of one parent from reaching each other; a frame sent into a port-less bridge
    # goes nowhere (a bridge does not pass its own transmissions up to the host); no gateway and
    # no routes but the pod range on-link. So a pod reaches nothing but its own loopback.
    cat >"$DIR/cni/net.d/10-kernelbridge-none.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "kernelbridge-none",
  "plugins": [
    {
      "type": "macvlan",
      "master": "$NULL_LINK",
      "mode": "private",
      "ipam": {"type": "host-local", "ranges": [[{"subnet": "$SANDBOX_POD_CIDR"}]], "routes": [],
               "dataDir": "$DIR/cni/ipam"}
    }
  ]
}
EOF
    # The node network: a veth to the host per pod (ptp) and one route, to the node's address (the
    # API server, the kubelet); no default route, so nothing beyond the node; the host reaches
    # the pod at its address (no kube-proxy, no NodePort needed from the host itself).
    cat >"$DIR/cni/net.d-node/10-kernelbridge-node.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "kernelbridge-node",
  "plugins": [
    {
      "type": "ptp",
      "ipMasq": false,
      "ipam": {"type": "host-local", "ranges": [[{"subnet": "$NODE_POD_CIDR"}]],
               "routes": [{"dst": "$NODE_IP/32"}], "dataDir": "$DIR/cni/ipam"}
    }
  ]
}
EOF
}

write_kubelet_config() {
    mkdir -p "$DIR/kubelet" "$DIR/pod-logs"
    cat >"$DIR/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzPort: 0
tlsCertFile: $DIR/pki/kubelet.crt
tlsPrivateKeyFile: $DIR/pki/kubelet.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $DIR/pki/ca.crt}
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://$CTRD_SOCK
# This host has cgroup v1 (hybrid); Kubernetes >= 1.35 refuses it unless told otherwise.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: $CGROUP_ROOT
failSwapOn: false
podLogsDir: $DIR/pod-logs
resolvConf: ""
# The sandbox's --pids-limit (kernelbridge/runtime/flags.py) has no Pod field: the node sets it.
podPidsLimit: 128
# No registry to pull from: imported images must never be garbage-collected, and disk pressure on
# a shared machine must not evict sandboxes (memory pressure still does).
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi"}
maxPods: 110
EOF
}

# -- processes -------------------------------------------------------------------------------------------

running() {  # running NAME: its recorded pid is alive
    local pid
    pid=$(cat "$DIR/run/$1.pid" 2>/dev/null) || return 1
    kill -0 "$pid" 2>/dev/null
}

start() {  # start NAME COMMAND...: in its own session, its output in logs/NAME.log, its pid recorded
    local name=$1
    shift
    running "$name" && return 0
    mkdir -p "$DIR/run" "$DIR/logs"
    setsid "$@" </dev/null >>"$DIR/logs/$name.log" 2>&1 &
    echo $! >"$DIR/run/$name.pid"
}

wait_for() {  # wait_for WHAT COMMAND...: until COMMAND succeeds, or the start timeout
    local what=$1 deadline=$((SECONDS + START_TIMEOUT))
    shift
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            die "timed out after ${START_TIMEOUT}s waiting for $what (logs in $DIR/logs)"
        fi
        for name in "${COMPONENTS[@]}"; do
            if [[ -f $DIR/run/$name.pid ]] && ! running "$name"; then
                tail -n 20 "$DIR/logs/$name.log" >&2 || true
                die "$name exited while waiting for $what (log: $DIR/logs/$name.log)"
            fi
        done
        sleep 0.2
    done
}

api_ready() {
    curl -sf --max-time 2 --cacert "$DIR/pki/ca.crt" --cert "$DIR/pki/admin.crt" --key "$DIR/pki/admin.key" \
        "https://$NODE_IP:$API_PORT/readyz"
}

kctl() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }
ctr_() { ctr --address "$CTRD_SOCK" --namespace k8s.io "$@"; }

ensure_links() {
    if ! ip link show "$NODE_LINK" >/dev/null 2>&1; then
        ip link add "$NODE_LINK" type bridge
    fi
    ip link set "$NODE_LINK" up
    ip addr replace "$NODE_IP/32" dev "$NODE_LINK"
    if ! ip link show "$NULL_LINK" >/dev/null 2>&1; then
        ip link add "$NULL_LINK" type bridge
    fi
    ip link set "$NULL_LINK" up
}

# The kubelet requires its cgroup root to exist in every hierarchy (cgroup v1 here); a new cpuset
# cgroup starts with no CPUs and no memory nodes, so it gets its parent's.
ensure_cgroup_root() {
    local root
    for root in /sys/fs/cgroup/*/; do
        [[ $root == */unified/ ]] && continue
        mkdir -p "$root${CGROUP_ROOT#/}"
        if [[ -f $root/cpuset.cpus ]]; then
            [[ -n $(cat "$root${CGROUP_ROOT#/}/cpuset.cpus") ]] || cat "$root/cpuset.cpus" >"$root${CGROUP_ROOT#/}/cpuset.cpus"
            [[ -n $(cat "$root${CGROUP_ROOT#/}/cpuset.mems") ]] || cat "$root/cpuset.mems" >"$root${CGROUP_ROOT#/}/cpuset.mems"
        fi
    done
}

# The kubelet sets these host-wide sysctls to its own values when it starts (they are not
# namespaced); `down` puts back what the host had.
KERNEL_TUNABLES=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes)
save_sysctls() {
    [[ -f $DIR/run/sysctl.saved ]] && return 0
    local key
    for key in "${KERNEL_TUNABLES[@]}"; do echo "$key=$(sysctl -n "$key")"; done >"$DIR/run/sysctl.saved"
}
restore_sysctls() {
    [[ -f $DIR/run/sysctl.saved ]] || return 0
    local line
    while read -r line; do sysctl -q -w "$line" >/dev/null || true; done <"$DIR/run/sysctl.saved"
    rm -f "$DIR/run/sysctl.saved"
}

import_image() {  # import_image IMAGE: from podman's store into the node's, unless already there
    local image=$1
    running containerd || die "the cluster is not running: $0 up"
    if ctr_ images ls -q | grep -qxF "$image"; then
        return 0
    fi
    say "importing $image into the node"
    podman image exists "$image" || die "$image is not in podman's store (kernelbridge image build makes it)"
    podman save --format docker-archive "$image" | ctr_ images import --digests - >/dev/null
}

# The image's labels (the agent's hash, the packages) for the kube backend's ImageStore: the API
# cannot read them from a node (kernelbridge/runtime/kube/images.py, ConfigMap kernelbridge-images).
record_image() {  # record_image IMAGE
    local image=$1 entry
    entry=$(podman image inspect --format '{{json .}}' "$image" | python3 -c '
import json, re, sys
info = json.load(sys.stdin)
info = info[0] if isinstance(info, list) else info
image = sys.argv[1]
entry = {"image": image, "labels": info.get("Labels") or {}, "id": info.get("Id", image), "created": 0.0}
print(json.dumps({"data": {re.sub(r"[^-._a-zA-Z0-9]", "_", image)[:253]: json.dumps(entry, sort_keys=True)}}))
' "$image")
    if ! kctl -n "$SANDBOX_NAMESPACE" get configmap kernelbridge-images >/dev/null 2>&1; then
        kctl -n "$SANDBOX_NAMESPACE" create configmap kernelbridge-images >/dev/null
    fi
    kctl -n "$SANDBOX_NAMESPACE" patch configmap kernelbridge-images --type merge -p "$entry" >/dev/null
}

default_sandbox_image() {
    [[ -x $REPO/.venv/bin/python ]] || return 0
    "$REPO/.venv/bin/python" -c 'from kernelbridge.testing import ensure_sandbox_image; print(ensure_sandbox_image())'
}

up() {
    [[ $(id -u) == 0 ]] || die "the kubelet and containerd need root"
    local started
    started=$(now)
    ensure_packages
    build
    mkdir -p "$DIR/run"
    write_pki
    write_containerd_config
    write_kubelet_config
    ensure_links
    ensure_cgroup_root
    save_sysctls

    mkdir -p "$DIR/kine"
    # A socket left by a component that was killed (SIGKILL, a reboot) would pass a wait on the
    # file at once while nothing listens on it.
    running kine || rm -f "$KINE_SOCK"
    running containerd || rm -f "$CTRD_SOCK"
    start kine "$BIN/kine" --listen-address "unix://$KINE_SOCK" --metrics-bind-address 0 \
        --endpoint "sqlite://$DIR/kine/state.db?_journal=WAL&cache=shared&_busy_timeout=30000"
    start containerd containerd --config "$DIR/containerd/config.toml"
    wait_for kine test -S "$KINE_SOCK"
    start kube-apiserver "$BIN/kube-apiserver" \
        --etcd-servers "unix://$KINE_SOCK" \
        --bind-address "$NODE_IP" --advertise-address "$NODE_IP" --secure-port "$API_PORT" \
        --service-cluster-ip-range "$SERVICE_CIDR" \
        --client-ca-file "$DIR/pki/ca.crt" \
        --tls-cert-file "$DIR/pki/apiserver.crt" --tls-private-key-file "$DIR/pki/apiserver.key" \
        --kubelet-client-certificate "$DIR/pki/apiserver-kubelet-client.crt" \
        --kubelet-client-key "$DIR/pki/apiserver-kubelet-client.key" \
        --kubelet-certificate-authority "$DIR/pki/ca.crt" \
        --kubelet-preferred-address-types InternalIP \
        --service-account-issuer "https://kubernetes.default.svc.cluster.local" \
        --service-account-key-file "$DIR/pki/sa.pub" \
        --service-account-signing-key-file "$DIR/pki/sa.key" \
        --authorization-mode Node,RBAC \
        --enable-admission-plugins NodeRestriction \
        --allow-privileged=false --profiling=false
    wait_for containerd ctr_ version
    ctr_ images import "$BIN/pause.tar" >/dev/null
    wait_for kube-apiserver api_ready
    start kube-controller-manager "$BIN/kube-controller-manager" \
        --kubeconfig "$DIR/controller-manager.kubeconfig" \
        --authentication-kubeconfig "$DIR/controller-manager.kubeconfig" \
        --authorization-kubeconfig "$DIR/controller-manager.kubeconfig" \
        --service-account-private-key-file "$DIR/pki/sa.key" --root-ca-file "$DIR/pki/ca.crt" \
        --use-service-account-credentials --leader-elect=false \
        --bind-address 127.0.0.1 --secure-port 0 --profiling=false
    start kube-scheduler "$BIN/kube-scheduler" \
        --kubeconfig "$DIR/scheduler.kubeconfig" \
        --authentication-kubeconfig "$DIR/scheduler.kubeconfig" \
        --authorization-kubeconfig "$DIR/scheduler.kubeconfig" \
        --leader-elect=false --bind-address 127.0.0.1 --secure-port 0 --profiling=false
    start kubelet "$BIN/kubelet" \
        --config "$DIR/kubelet-config.yaml" --kubeconfig "$DIR/kubelet.kubeconfig" \
        --root-dir "$DIR/kubelet" --hostname-override "$NODE_NAME" --node-ip "$NODE_IP"
    local image=${KERNELBRIDGE_KUBE_IMAGE:-$(default_sandbox_image)}
    if [[ -n $image ]]; then import_image "$image"; fi
    wait_for "node $NODE_NAME to be Ready" node_ready
    sandbox_namespace
    if [[ -n $image ]]; then record_image "$image"; fi
    say "up in $(since "$started") s"
    echo "KUBECONFIG=$KUBECONFIG_ADMIN"
}

node_ready() {
    [[ $(kctl get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}') == True ]]
}

# The namespace sandboxes run in: Pod Security "restricted" enforced (the sandbox pods pass it),
# the deny-all NetworkPolicy of kernelbridge/runtime/kube/manifest.py for a cluster whose network
# enforces policies (this one's has nothing to enforce: its pods have no network), an admission
# policy that refuses the node network's RuntimeClass there, and the default ServiceAccount that
# pod admission looks up.
sandbox_namespace() {
    kctl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata:
  name: $SANDBOX_NAMESPACE
  labels:
    pod-security.kubernetes.io/enforce: restricted
    pod-security.kubernetes.io/enforce-version: latest
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: kernelbridge-sandboxes-deny-all
  namespace: $SANDBOX_NAMESPACE
spec:
  podSelector: {matchLabels: {kernelbridge.sandbox: "true"}}
  policyTypes: [Ingress, Egress]
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: $NODE_NETWORK_CLASS
handler: runc-node-network
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: kernelbridge-sandboxes-no-node-network
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: [""]
      apiVersions: [v1]
      operations: [CREATE, UPDATE]
      resources: [pods]
  validations:
  - expression: "!has(object.spec.runtimeClassName) || object.spec.runtimeClassName != '$NODE_NETWORK_CLASS'"
    message: "pods in the sandbox namespace get no network: RuntimeClass $NODE_NETWORK_CLASS is refused here"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: kernelbridge-sandboxes-no-node-network
spec:
  policyName: kernelbridge-sandboxes-no-node-network
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels: {kubernetes.io/metadata.name: $SANDBOX_NAMESPACE}
EOF
    wait_for "the default ServiceAccount of $SANDBOX_NAMESPACE" kctl -n "$SANDBOX_NAMESPACE" get serviceaccount default
}

# -- down ------------------------------------------------------------------------------------------------

stop() {  # stop NAME...: SIGTERM to their sessions at once, a bounded wait, then SIGKILL
    local name pid pids=() deadline=$((SECONDS + STOP_TIMEOUT))
    for name in "$@"; do
        pid=$(cat "$DIR/run/$name.pid" 2>/dev/null) || continue
        if kill -0 "$pid" 2>/dev/null; then
            kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
        fi
    done
    for pid in "${pids[@]}"; do
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
        while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    done
    for name in "$@"; do rm -f "$DIR/run/$name.pid"; done
}

# containerd's shims (one per pod) outlive containerd by design; they are ours when their command
# line names this cluster's socket.
shim_pids() {
    local proc cmdline
    for proc in /proc/[0-9]*; do
        cmdline=$(tr '\0' ' ' 2>/dev/null <"$proc/cmdline") || continue
        if [[ $cmdline == *"-address $CTRD_SOCK "* ]]; then echo "${proc#/proc/}"; fi
    done
}

remove_containers() {
    [[ -S $CTRD_SOCK ]] && running containerd || return 0
    local id
    for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
    for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks delete -f "$id" >/dev/null 2>&1 || true; done
    for id in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$id" >/dev/null 2>&1 || true; done
}

unmount_all() {  # every mount under the cluster's directory, deepest first
    local target
    awk '{print $5}' /proc/self/mountinfo | { grep -F "$DIR/" || true; } | sort -r | while read -r target; do
        umount "$target" 2>/dev/null || umount -l "$target" 2>/dev/null || true
    done
}

remove_cgroups() {  # the kubelet's cgroups under CGROUP_ROOT in each hierarchy, leaves first
    local root
    for root in /sys/fs/cgroup/*/; do
        [[ $root == */unified/ || ! -d $root${CGROUP_ROOT#/} ]] && continue
        find "$root${CGROUP_ROOT#/}" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
}

down() {
    [[ -d $DIR ]] || return 0
    # A second node started beside this one (scripts/kube-second-node.sh) goes first.
    if [[ -d $DIR/node-2 ]]; then "$REPO/scripts/kube-second-node.sh" down || true; fi
    # Pods first, through the API while it runs, so that the kubelet stops them cleanly.
    if running kube-apiserver && running kubelet && api_ready >/dev/null 2>&1; then
        kctl delete pods --all --all-namespaces --grace-period=1 --timeout=30s >/dev/null 2>&1 || true
    fi
    stop kubelet kube-scheduler kube-controller-manager kube-apiserver
    remove_containers
    stop containerd kine
    local pid
    for pid in $(shim_pids); do kill -KILL "$pid" 2>/dev/null || true; done
    unmount_all
    remove_cgroups
    restore_sysctls
    # The node network's host ends (ptp) of pods that the kubelet did not stop itself: each holds
    # the range's gateway address.
    local link
    for link in $(ip -o addr show to "${NODE_POD_CIDR%.0/*}.1/32" | awk '{print $2}'); do
        ip link del "${link%@*}" 2>/dev/null || true
    done
    ip link del "$NODE_LINK" 2>/dev/null || true
    ip link del "$NULL_LINK" 2>/dev/null || true
    rm -rf "$DIR/containerd/state" "$DIR/cni/ipam"
    if [[ ${1:-} == --purge ]]; then
        rm -rf "$DIR"
    fi
    say "down"
}

status() {
    local name rc=0
    for name in "${COMPONENTS[@]}"; do
        if running "$name"; then echo "$name running (pid $(cat "$DIR/run/$name.pid"))"; else
            echo "$name stopped"
            rc=1
        fi
    done
    return $rc
}

# Sourced (scripts/kube-second-node.sh): its constants and helpers only.
[[ ${BASH_SOURCE[0]} == "$0" ]] || return 0

case ${1:-} in
build) build ;;
built) [[ -f $BIN/.stamp && $(cat "$BIN/.stamp") == "$(build_stamp)" ]] ;;
up) up ;;
down) down "${2:-}" ;;
status) status ;;
import)
    [[ -n ${2:-} ]] || die "usage: $0 import IMAGE"
    import_image "$2"
    # Only sandbox images go into the sandbox ImageStore's records (the bridge's own does not).
    if [[ $2 == localhost/kernelbridge-sandbox:* ]]; then record_image "$2"; fi
    ;;
kubectl)
    shift
    [[ -x $BIN/kubectl ]] || die "not built: $0 build"
    # The API server's address exists only while the cluster runs: never send its traffic out to
    # whatever the host's default route leads to.
    running kube-apiserver || die "the cluster is not running: $0 up"
    exec "$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@"
    ;;
*)
    sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
