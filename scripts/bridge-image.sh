#!/usr/bin/env bash
# Build the bridge's own container image (`kernelbridge serve --http` in a pod) without a registry,
# the way the sandbox image is built (kernelbridge/image/rootfs.py): Debian bookworm minbase with
# python3 from the Debian mirror (mmdebstrap), this checkout as a wheel and its dependencies (the
# `kube` extra included) as manylinux wheels for CPython 3.11 from PyPI, then `podman import`.
#
# Usage: scripts/bridge-image.sh [--import]
#   --import   also load the image into the development cluster's node (scripts/kube-cluster.sh import)
#
# The image is tagged localhost/kernelbridge-bridge:<hash>, a sha256 over the wheel's files (its
# RECORD) and the versions of every installed package, and also :latest; the last line printed is
# the tag. It runs as uid/gid 10001 (no name needed; HOME is /tmp), with PYTHONDONTWRITEBYTECODE
# (the root is read-only in the pod; the bytecode is compiled at build time) and the state directory
# /var/lib/kernelbridge (the pod mounts its PersistentVolume there). The sandbox image the bridge
# expects is the one of the same checkout (label kernelbridge.sandbox-image): build it with
# `kernelbridge image build` and import both (deploy/kubernetes/README.md).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${KERNELBRIDGE_PYTHON:-$REPO/.venv/bin/python}
REPOSITORY=localhost/kernelbridge-bridge
SITE=usr/local/lib/python3.11/dist-packages
BRIDGE_UID=10001
MIRROR=${KERNELBRIDGE_DEBIAN_MIRROR:-http://deb.debian.org/debian}

say() { printf 'bridge-image: %s\n' "$*" >&2; }
die() {
    say "$*"
    exit 1
}
now() { date +%s.%N; }
since() { awk -v now="$(now)" -v start="$1" 'BEGIN { printf "%.1f", now - start }'; }

import=0
case ${1:-} in
"") ;;
--import) import=1 ;;
*) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac

command -v mmdebstrap >/dev/null || die "mmdebstrap is not installed (sudo apt-get install mmdebstrap)"
command -v podman >/dev/null || die "podman is not installed"
[[ -x $PYTHON ]] || die "no Python at $PYTHON: run scripts/setup.sh --venv-only (or set KERNELBRIDGE_PYTHON)"
[[ $(id -u) == 0 ]] || die "mmdebstrap's root mode needs root here (the sandbox image's unshare mode is not wired in this script)"

started=$(now)
work=$(mktemp -d /tmp/kernelbridge-bridge-image.XXXXXX)
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"

say "wheel of $REPO ..."
"$PYTHON" -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir "$work/dist" "$REPO" >&2
wheel=$(ls "$work"/dist/kernelbridge_mcp-*.whl)

say "dependencies (manylinux wheels for CPython 3.11) ..."
mapfile -t target_flags < <("$PYTHON" -c 'from kernelbridge.image.target import PIP_TARGET_FLAGS; print("\n".join(PIP_TARGET_FLAGS))')
PIP_CONSTRAINT="" "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-compile \
    --no-warn-script-location "${target_flags[@]}" --target "$work/overlay/$SITE" "${wheel}[kube]" >&2
rm -rf "$work/overlay/$SITE/bin"
mkdir -p "$work/overlay/usr/local/bin"
cat >"$work/overlay/usr/local/bin/kernelbridge" <<'EOF'
#!/usr/bin/python3
import sys

from kernelbridge.cli import main

sys.exit(main())
EOF
chmod 755 "$work/overlay/usr/local/bin/kernelbridge"

# The image's name: the wheel's files (RECORD lists each file's sha256) and every package's version.
hash=$(
    {
        unzip -p "$wheel" '*.dist-info/RECORD' | grep -v '/RECORD,' | sort
        "$PYTHON" -c '
import importlib.metadata, sys
for d in sorted(importlib.metadata.distributions(path=[sys.argv[1]]), key=lambda d: d.metadata["Name"].lower()):
    print(d.metadata["Name"], d.version)' "$work/overlay/$SITE"
    } | sha256sum | cut -c1-16
)
tag=$REPOSITORY:$hash
sandbox=$("$PYTHON" -c 'from kernelbridge.image import default_image; print(default_image())')
if podman image exists "$tag"; then
    say "$tag is current"
else
    say "bootstrap Debian bookworm (python3) and the overlay ..."
    cat >"$work/customize.sh" <<EOF
#!/bin/sh
set -eu
root="\$1"
mkdir -p "\$root/var/lib/kernelbridge" "\$root/tmp"
chown $BRIDGE_UID:$BRIDGE_UID "\$root/var/lib/kernelbridge"
chmod 1777 "\$root/tmp"
echo "kernelbridge:x:$BRIDGE_UID:$BRIDGE_UID:kernelbridge:/tmp:/usr/sbin/nologin" >>"\$root/etc/passwd"
echo "kernelbridge:x:$BRIDGE_UID:" >>"\$root/etc/group"
rm -rf "\$root"/var/lib/apt/lists/* "\$root"/var/cache/apt/* "\$root"/var/log/apt "\$root"/var/log/dpkg.log
# The root is read-only in the pod: compile the bytecode now, with the image's own python3.
chroot "\$root" python3 -m compileall -q -j 0 /$SITE >/dev/null || true
EOF
    mmdebstrap --quiet --mode=root --variant=minbase --include=python3,ca-certificates \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --customize-hook="sync-in $work/overlay /" --customize-hook="sh $work/customize.sh \"\$1\"" \
        bookworm "$work/rootfs.tar" "$MIRROR" >&2
    say "import into podman ..."
    podman import \
        --change "USER $BRIDGE_UID:$BRIDGE_UID" \
        --change "WORKDIR /var/lib/kernelbridge" \
        --change "ENV HOME=/tmp" \
        --change "ENV PYTHONDONTWRITEBYTECODE=1" \
        --change "ENV PYTHONUNBUFFERED=1" \
        --change "ENV KERNELBRIDGE_STATE_DIR=/var/lib/kernelbridge" \
        --change 'ENTRYPOINT ["/usr/local/bin/kernelbridge"]' \
        --change 'CMD ["serve", "--http", "--host", "0.0.0.0", "--port", "8765"]' \
        --change "LABEL kernelbridge.bridge-image=$hash" \
        --change "LABEL kernelbridge.sandbox-image=$sandbox" \
        "$work/rootfs.tar" "$tag" >/dev/null
fi
podman tag "$tag" "$REPOSITORY:latest"
size=$(podman image inspect --format '{{.Size}}' "$tag")
say "built $tag in $(since "$started") s ($((size / 1000000)) MB; it expects the sandbox image $sandbox)"
if ((import)); then
    "$REPO/scripts/kube-cluster.sh" import "$tag"
fi
echo "$tag"
