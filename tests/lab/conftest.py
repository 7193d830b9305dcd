"""The lab tier: ``kernelbridge lab`` (real jupyter_server and JupyterLab) on real bridges' sessions,
looked at in a real browser (Debian's chromium, headless, driven by Selenium through chromedriver).

Every test here is marked ``lab`` and skips with one line when a part is missing
(``scripts/setup.sh`` installs them all). ``lab_of`` starts the command as a person does, on a
free loopback port with a token of the test's (``JUPYTER_TOKEN``, jupyter_server's own variable),
and stops it with SIGTERM; ``browser`` is one chromium per module, with a fresh profile.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import signal
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from bridge_harness import KERNELBRIDGE, free_port

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
LAB_START = 90.0
"""Bound on `kernelbridge lab` answering (JupyterLab's start on a loaded 2-core machine: seconds)."""
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",  # we run as root
    "--disable-gpu",
    "--disable-dev-shm-usage",
    # This machine's network is closed: without these chromium's own connections are refused.
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
)


def missing() -> str | None:
    """Why the tier cannot run here, in one line (None: it can)."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not path.exists():
            return f"{path} is missing (apt-get install {package}; scripts/setup.sh does)"
    for module, install in (
        ("jupyterlab", "pip install -e '.[lab]'"),
        ("selenium", "pip install -e '.[test]'"),
    ):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed ({install}; scripts/setup.sh does)"
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    why = missing()
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.lab)
            if why:
                item.add_marker(pytest.mark.skip(reason=f"lab tier: {why}"))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    profile = tempfile.mkdtemp(prefix="kernelbridge-chromium-")
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(LAB_START)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@dataclass
class Lab:
    base: str
    token: str
    log: Path

    @property
    def url(self) -> str:
        return f"{self.base}/lab?token={self.token}"

    def api(self, path: str, method: str = "GET", token: str | None = None) -> tuple[int, str]:
        """One REST call (status, body), with the lab's token unless ``token`` is given."""
        request = urllib.request.Request(f"{self.base}{path}", method=method)
        request.add_header("Authorization", f"token {self.token if token is None else token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()


LabFactory = Callable[..., AbstractAsyncContextManager[Lab]]


@pytest.fixture
def lab_of(tmp_path: Path) -> LabFactory:
    """``async with lab_of(state_dir, *args) as lab``: ``kernelbridge lab --no-browser`` on
    ``state_dir``'s sessions, stopped with SIGTERM afterwards (it must exit 0)."""

    @asynccontextmanager
    async def start(state_dir: Path, *args: str, **env: str) -> AsyncIterator[Lab]:
        port = free_port()
        token = secrets.token_hex(16)
        log = tmp_path / f"lab-{port}.log"
        home = tmp_path / "home"  # a person with no Jupyter settings of their own yet
        home.mkdir(exist_ok=True)
        environ = {
            **os.environ,
            "KERNELBRIDGE_STATE_DIR": str(state_dir),
            # A token of this lab's own: another test's lab that took the same port meanwhile
            # answers it 403, never as if it were this one.
            "JUPYTER_TOKEN": token,
            "HOME": str(home),
            **env,
        }
        for inherited in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "XDG_STATE_HOME"):
            environ.pop(inherited, None)
        # --allow-root: the tests run as root, which Jupyter refuses unless told (a person is not root).
        argv = [str(KERNELBRIDGE), "lab", "--no-browser", "--allow-root", "--port", str(port), *args]
        with log.open("wb") as out:  # a new local file: no wait worth a thread
            process = await anyio.open_process(argv, env=environ, stdout=out, stderr=out)
        lab = Lab(f"http://127.0.0.1:{port}", token, log)
        try:
            deadline = time.monotonic() + LAB_START
            while lab_status(lab) != 200:
                assert process.returncode is None, f"kernelbridge lab exited: {log.read_text()[-3000:]}"
                assert time.monotonic() < deadline, (
                    f"kernelbridge lab did not answer: {log.read_text()[-3000:]}"
                )
                await anyio.sleep(0.2)
            yield lab
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
            with anyio.fail_after(60):
                status = await process.wait()
            assert status == 0, f"kernelbridge lab exited with {status}: {log.read_text()[-3000:]}"

    return start


def lab_status(lab: Lab) -> int:
    try:
        return lab.api("/api/status")[0]
    except OSError:
        return 0
