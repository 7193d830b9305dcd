#!/bin/sh
# Finish a sandbox root file system whose packages and agent are already in place.
#
# Usage: customize.sh ROOT
#   ROOT is the root file system to finish: a directory on the host when the registry-free builder
#   (kernelbridge/image.py) runs this as an mmdebstrap customize hook, or "/" inside `podman build`
#   (Containerfile). Both builders share this one script so the two images have the same layout.
#
# It creates the mount points the sandbox needs, trims what a kernel never reads (apt lists,
# docs, man pages, locales), and pre-compiles bytecode: the container's root is read-only and
# PYTHONDONTWRITEBYTECODE is set, so without .pyc files every kernel start would recompile
# ipykernel, IPython, numpy... in memory (measured: seconds instead of a fraction of one).
set -eu

root="${1:?usage: customize.sh ROOT}"
root="${root%/}"
site="/usr/local/lib/python3.11/dist-packages"

in_root() {
    if [ -z "$root" ]; then "$@"; else chroot "$root" "$@"; fi
}

# Mount points: /workspace, /tmp and /packages (the session's `%pip install`s) are tmpfs at run
# time, but must exist (and be usable without them, e.g. under `podman run` by hand).
mkdir -p "$root/workspace" "$root/tmp" "$root/packages"
chmod 1777 "$root/workspace" "$root/tmp" "$root/packages"

# Trim. Copyright files stay: they are the licences of what we ship.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old \
    "$root"/var/log/apt "$root"/var/log/dpkg.log "$root"/var/log/alternatives.log \
    "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
    "$root"/usr/share/lintian "$root$site/bin"
if [ -d "$root/usr/share/doc" ]; then
    find "$root/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
    find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
fi
# Test suites of the data stack: a hundred MB that no kernel imports (scipy, scikit-learn,
# statsmodels, sympy and pyarrow ship theirs inside the package, a directory per module).
rm -rf "$root$site/pandas/tests" "$root$site/matplotlib/tests" "$root$site/mpl_toolkits"/*/tests
for package in numpy scipy sklearn statsmodels sympy pyarrow seaborn; do
    if [ -d "$root$site/$package" ]; then
        find "$root$site/$package" -type d -name tests -prune -exec rm -rf {} + 2>/dev/null || true
    fi
done

# Stale bytecode (from whatever Python staged the files), then fresh bytecode from the image's own
# interpreter so the cache tag and magic number are right.
find "$root$site" "$root/opt/kernelbridge" -type d -name __pycache__ -prune -exec rm -rf {} +
# compileall exits non-zero if any one file fails (some packages ship Python 2 templates); a few
# uncompiled files only cost start time, so say so and go on.
in_root python3 -m compileall -q -j 0 "$site" /opt/kernelbridge >/dev/null \
    || echo "customize.sh: some files did not compile (they will be compiled in memory)" >&2
