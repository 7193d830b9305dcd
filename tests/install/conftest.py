"""Installing kernelbridge as a user would: built distributions, fresh virtualenvs outside the
checkout, and an unprivileged user.

These are the slowest tests of the suite (a build, a pip install, for the unprivileged user an
image build the first time), so their expensive results are cached, keyed by content:

- the distributions are built once per test session;
- the unprivileged user ``kb-nonroot`` is created once and kept (idempotent: ``useradd`` and
  subordinate id ranges only when missing); its podman storage keeps its sandbox image, and its
  home keeps one virtualenv per set of the wheel's dependencies (older ones are removed), so a
  second run repeats neither the image build nor the dependencies' install: a change of code
  reinstalls the wheel alone. ``userdel -r kb-nonroot`` removes all of it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from install_harness import (
    BUILD_TIMEOUT,
    DIST_FILE,
    PIP_TIMEOUT,
    REPO,
    SUBID_BASE,
    SUBID_COUNT,
    TEST_USER,
    USER_PYTHON,
    Dists,
    TestUser,
    has_subids,
    run,
)


@pytest.fixture(scope="session")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    """An sdist and a wheel built from it with `python -m build` (isolated, as a release would)."""
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--outdir", str(out), str(REPO)], timeout=BUILD_TIMEOUT)
    (sdist,) = out.glob(f"{DIST_FILE}-*.tar.gz")
    (wheel,) = out.glob(f"{DIST_FILE}-*.whl")
    return Dists(sdist, wheel)


@pytest.fixture(scope="session")
def test_user() -> TestUser:
    """The unprivileged user ``kb-nonroot``, with subordinate ids (see the module docstring)."""
    if os.geteuid() != 0:
        pytest.skip("creating an unprivileged test user needs root")
    for tool in ("useradd", "runuser", "podman", "mmdebstrap", "newuidmap"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    try:
        entry = pwd.getpwnam(TEST_USER)
    except KeyError:
        run(["useradd", "--create-home", "--shell", "/bin/bash", TEST_USER], timeout=60)
        entry = pwd.getpwnam(TEST_USER)
    for path in (Path("/etc/subuid"), Path("/etc/subgid")):
        if not has_subids(path, TEST_USER):
            with path.open("a") as file:
                file.write(f"{TEST_USER}:{SUBID_BASE}:{SUBID_COUNT}\n")
    return TestUser(TEST_USER, entry.pw_uid, Path(entry.pw_dir))


@pytest.fixture(scope="session")
def user_venv(test_user: TestUser, dists: Dists) -> Path:
    """A virtualenv of the test user with the wheel and its test extras, cached by the wheel's
    dependencies: when only the code changed, the wheel alone is reinstalled (``--no-deps``)."""
    cache = test_user.home / ".cache" / "kernelbridge-test"
    venv = cache / f"venv-{dists.requirements_digest()}"
    complete = venv / ".installed"  # written last, with the wheel's digest: an interrupted install is redone
    if complete.exists() and complete.read_text() == dists.digest():
        return venv
    # The wheel must be readable by the user: copy it where the user can read it.
    run(test_user.argv("mkdir", "-p", str(cache)), timeout=60)
    wheel = cache / dists.wheel.name
    shutil.copyfile(dists.wheel, wheel)
    os.chown(wheel, test_user.uid, -1)
    pip = [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check"]
    if complete.exists():
        complete.unlink()
        run(test_user.argv(*pip, "--no-deps", "--force-reinstall", str(wheel)), timeout=PIP_TIMEOUT)
    else:
        for old in cache.glob("venv-*"):
            shutil.rmtree(old, ignore_errors=True)
        run(test_user.argv(USER_PYTHON, "-m", "venv", str(venv)), timeout=PIP_TIMEOUT)
        run(test_user.argv(*pip, f"{wheel}[test]"), timeout=PIP_TIMEOUT)
    complete.write_text(dists.digest())
    return venv


@pytest.fixture
def user_tmp(test_user: TestUser) -> Iterator[Path]:
    """A temporary directory owned by the test user, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="kb-nonroot-"))
    os.chown(path, test_user.uid, -1)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
