#!/usr/bin/env bash
# A second node for the development cluster of scripts/kube-cluster.sh: its own containerd and
# kubelet on this machine, joined to the running cluster, so that the scheduler has a choice and a
# node can die while the other goes on (tests/kube/test_two_nodes.py):
#
#   scripts/kube-second-node.sh up [IMAGE]   start it (the cluster must be up), import the pause
#                                            and sandbox images, wait for it to be Ready
#   scripts/kube-second-node.sh stop         kill it as a crash would: its kubelet and containerd
#                                            frozen, every process of its pods killed, then they;
#                                            nothing tells the API server (the Node stays)
#   scripts/kube-second-node.sh down         stop it, delete its pods and its Node, leave nothing
#                                            running or mounted (kube-cluster.sh down calls this)
#
# Its configuration is the first node's as kube-cluster.sh wrote it, with its own directory
# (node-2 under the cluster's), address, kubelet port, certificates, cgroup root and pod ranges.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=kube-cluster.sh
source "$REPO/scripts/kube-cluster.sh"

NODE_DIR=$DIR/node-2
NODE2_NAME=kernelbridge-node-2
NODE2_IP=198.18.255.2
NODE2_KUBELET_PORT=$((API_PORT + 8))
NODE2_CGROUP_ROOT=/kernelbridge-kube-2
NODE2_SANDBOX_POD_CIDR=198.18.0.0/18
NODE2_NODE_POD_CIDR=198.18.64.0/18
NODE2_SOCK=$NODE_DIR/containerd/containerd.sock
# In kube-cluster.sh's run directory, beside the first node's, so its start/running/stop work.
NODE2_COMPONENTS=(node-2-kubelet node-2-containerd)

ctr2() { ctr --address "$NODE2_SOCK" --namespace k8s.io "$@"; }

# The first node's files with this node's paths, addresses and ranges.
derive() {  # derive SOURCE TARGET
    sed -e "s|$DIR/containerd|$NODE_DIR/containerd|g" \
        -e "s|$DIR/cni|$NODE_DIR/cni|g" \
        -e "s|$DIR/kubelet|$NODE_DIR/kubelet|g" \
        -e "s|$DIR/pod-logs|$NODE_DIR/pod-logs|g" \
        -e "s|$SANDBOX_POD_CIDR|$NODE2_SANDBOX_POD_CIDR|g" \
        -e "s|$NODE_POD_CIDR|$NODE2_NODE_POD_CIDR|g" \
        "$1" >"$2"
}

write_node_config() {
    [[ -f $DIR/kubelet-config.yaml && -f $DIR/containerd/config.toml ]] ||
        die "the first node's configuration is missing: scripts/kube-cluster.sh up"
    mkdir -p "$NODE_DIR/containerd" "$NODE_DIR/cni/net.d" "$NODE_DIR/cni/net.d-node" "$NODE_DIR/cni/ipam" \
        "$NODE_DIR/kubelet" "$NODE_DIR/pod-logs"
    cp "$DIR/containerd/base-spec.json" "$NODE_DIR/containerd/base-spec.json"
    derive "$DIR/containerd/config.toml" "$NODE_DIR/containerd/config.toml"
    derive "$DIR/cni/net.d/10-kernelbridge-none.conflist" "$NODE_DIR/cni/net.d/10-kernelbridge-none.conflist"
    derive "$DIR/cni/net.d-node/10-kernelbridge-node.conflist" "$NODE_DIR/cni/net.d-node/10-kernelbridge-node.conflist"
    derive "$DIR/kubelet-config.yaml" "$NODE_DIR/kubelet-config.yaml.in"
    # Both kubelets see the machine's CPUs: keep one back on this one, so that the two do not
    # promise the scheduler twice what the machine has (a smaller node, as clusters often have).
    sed -e "s|^address: .*|address: $NODE2_IP|" \
        -e "s|^port: .*|port: $NODE2_KUBELET_PORT|" \
        -e "s|^tlsCertFile: .*|tlsCertFile: $DIR/pki/kubelet-2.crt|" \
        -e "s|^tlsPrivateKeyFile: .*|tlsPrivateKeyFile: $DIR/pki/kubelet-2.key|" \
        -e "s|^cgroupRoot: .*|cgroupRoot: $NODE2_CGROUP_ROOT|" \
        "$NODE_DIR/kubelet-config.yaml.in" >"$NODE_DIR/kubelet-config.yaml"
    printf 'systemReserved: {cpu: "1"}\n' >>"$NODE_DIR/kubelet-config.yaml"
    rm -f "$NODE_DIR/kubelet-config.yaml.in"
    sign kubelet-client-2 "/O=system:nodes/CN=system:node:$NODE2_NAME"
    sign kubelet-2 "/CN=$NODE2_NAME" "IP:$NODE2_IP,DNS:$NODE2_NAME"
    kubeconfig "$NODE_DIR/kubelet.kubeconfig" kubelet-client-2
}

node2_ready() {
    [[ $(kctl get node "$NODE2_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}') == True ]]
}

import_into_node2() {  # import_into_node2 IMAGE
    local image=$1
    ctr2 images ls -q | grep -qxF "$image" && return 0
    say "importing $image into $NODE2_NAME"
    podman image exists "$image" || die "$image is not in podman's store (kernelbridge image build makes it)"
    podman save --format docker-archive "$image" | ctr2 images import --digests - >/dev/null
}

up2() {
    [[ $(id -u) == 0 ]] || die "the kubelet and containerd need root"
    running kube-apiserver || die "the cluster is not running: scripts/kube-cluster.sh up"
    local started image
    started=$(now)
    write_node_config
    ip addr add "$NODE2_IP/32" dev "$NODE_LINK" 2>/dev/null || true
    CGROUP_ROOT=$NODE2_CGROUP_ROOT ensure_cgroup_root
    running node-2-containerd || rm -f "$NODE2_SOCK"
    start node-2-containerd containerd --config "$NODE_DIR/containerd/config.toml"
    wait_for "$NODE2_NAME's containerd" ctr2 version
    ctr2 images import "$BIN/pause.tar" >/dev/null
    image=${1:-${KERNELBRIDGE_KUBE_IMAGE:-$(default_sandbox_image)}}
    if [[ -n $image ]]; then import_into_node2 "$image"; fi
    start node-2-kubelet "$BIN/kubelet" \
        --config "$NODE_DIR/kubelet-config.yaml" --kubeconfig "$NODE_DIR/kubelet.kubeconfig" \
        --root-dir "$NODE_DIR/kubelet" --hostname-override "$NODE2_NAME" --node-ip "$NODE2_IP"
    wait_for "node $NODE2_NAME to be Ready" node2_ready
    say "$NODE2_NAME up in $(since "$started") s"
}

node2_shims() { CTRD_SOCK=$NODE2_SOCK shim_pids; }

# Every process in this node's cgroups (its pods' containers), in every hierarchy.
node2_cgroup_pids() {
    local root
    for root in /sys/fs/cgroup/*/; do
        [[ $root == */unified/ || ! -d $root${NODE2_CGROUP_ROOT#/} ]] && continue
        find "$root${NODE2_CGROUP_ROOT#/}" -name cgroup.procs -exec cat {} + 2>/dev/null || true
    done | sort -u
}

crash2() {  # the node dies: no process of it runs on, and nobody tells the API server
    local name pid
    for name in "${NODE2_COMPONENTS[@]}"; do
        pid=$(cat "$DIR/run/$name.pid" 2>/dev/null) || continue
        kill -STOP "$pid" 2>/dev/null || true  # frozen first, so neither reports a pod's death
    done
    for pid in $(node2_cgroup_pids) $(node2_shims); do kill -KILL "$pid" 2>/dev/null || true; done
    for name in "${NODE2_COMPONENTS[@]}"; do
        pid=$(cat "$DIR/run/$name.pid" 2>/dev/null) || continue
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
        while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
        rm -f "$DIR/run/$name.pid"
    done
}

down2() {
    [[ -d $NODE_DIR ]] || return 0
    crash2
    if running kube-apiserver && api_ready >/dev/null 2>&1; then
        # Its pods cannot be stopped by a kubelet that is gone: removed from the API at once.
        kctl delete pods --all-namespaces --field-selector "spec.nodeName=$NODE2_NAME" \
            --grace-period=0 --force >/dev/null 2>&1 || true
        kctl delete node "$NODE2_NAME" --ignore-not-found >/dev/null 2>&1 || true
    fi
    local target root
    awk '{print $5}' /proc/self/mountinfo | { grep -F "$NODE_DIR/" || true; } | sort -r | while read -r target; do
        umount "$target" 2>/dev/null || umount -l "$target" 2>/dev/null || true
    done
    for root in /sys/fs/cgroup/*/; do
        [[ $root == */unified/ || ! -d $root${NODE2_CGROUP_ROOT#/} ]] && continue
        find "$root${NODE2_CGROUP_ROOT#/}" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
    # The node network's host ends (ptp) of its pods hold that range's gateway address.
    local link
    for link in $(ip -o addr show to "${NODE2_NODE_POD_CIDR%.0/*}.1/32" 2>/dev/null | awk '{print $2}'); do
        ip link del "${link%@*}" 2>/dev/null || true
    done
    ip addr del "$NODE2_IP/32" dev "$NODE_LINK" 2>/dev/null || true
    rm -rf "$NODE_DIR/containerd/state" "$NODE_DIR/cni/ipam"
    say "$NODE2_NAME down"
}

case ${1:-} in
up) up2 "${2:-}" ;;
stop) crash2 ;;
down) down2 ;;
*)
    sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
