"""What a person does in the lab's page and what they see there, through Selenium: JupyterLab's
own DOM (its Running panel, consoles, notebooks), every wait bounded."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import anyio

PAGE_WAIT = 60.0
"""Bound on anything appearing in the page (JupyterLab's Running panel polls every few seconds)."""
T = TypeVar("T")


async def until(probe: Callable[[], T | None], what: str, driver: Any, timeout: float = PAGE_WAIT) -> T:
    """``probe()``'s first truthy answer, polled within ``timeout``; fails saying ``what`` with a
    screenshot's path and the page's text."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            shot = f"/tmp/kernelbridge-lab-{int(time.time())}.png"
            driver.save_screenshot(shot)
            body = driver.find_element("css selector", "body").text[-3000:]
            raise AssertionError(f"{what}: not seen within {timeout:g} s (screenshot {shot}); page:\n{body}")
        await anyio.sleep(0.25)


def elements(driver: Any, css: str) -> list[Any]:
    try:
        return list(driver.find_elements("css selector", css))
    except Exception:  # the DOM changed under the query: ask again on the next poll
        return []


def clicked(element: Any) -> bool:
    """Click ``element``; False when the page is still settling (another element lies over it for
    a moment, or it was re-rendered meanwhile): the caller's poll clicks again on its next turn."""
    from selenium.common.exceptions import ElementClickInterceptedException, StaleElementReferenceException

    try:
        element.click()
    except (ElementClickInterceptedException, StaleElementReferenceException):
        return False
    return True


def text_of(element: Any) -> str:
    try:
        return str(element.text)
    except Exception:  # stale: gone from the page meanwhile
        return ""


async def open_lab(driver: Any, url: str) -> None:
    driver.get(url)
    await until(lambda: elements(driver, "#jp-main-dock-panel"), "JupyterLab's main area", driver)


async def running_items(driver: Any) -> list[str]:
    """The labels in JupyterLab's Running panel (shown first), after its refresh button."""
    tab = elements(driver, 'li[data-id="jp-running-sessions"]')
    if tab and "lm-mod-current" not in (tab[0].get_attribute("class") or ""):
        clicked(tab[0])
    for button in elements(driver, '#jp-running-sessions jp-button[title="Refresh List"]'):
        clicked(button)
    await anyio.sleep(0.5)
    return [text_of(e) for e in elements(driver, "#jp-running-sessions .jp-RunningSessions-itemLabel")]


async def open_from_running(driver: Any, label: str) -> None:
    """Click the Running panel's item ``label`` (a session's console or notebook)."""

    async def item() -> Any:
        await running_items(driver)
        for element in elements(driver, "#jp-running-sessions .jp-RunningSessions-itemLabel"):
            if text_of(element) == label:
                return element
        return None

    deadline = time.monotonic() + PAGE_WAIT
    while (found := await item()) is None or not clicked(found):
        assert time.monotonic() < deadline, f"no {label!r} under Running: {await running_items(driver)}"
        await anyio.sleep(1)


def console_cells(driver: Any) -> list[dict[str, Any]]:
    """The cells of the open console (its prompt excluded): their code, output text, images."""
    cells = []
    for cell in elements(driver, ".jp-CodeConsole-content .jp-CodeCell"):
        try:
            code = " ".join(text_of(line) for line in cell.find_elements("css selector", ".cm-line"))
            outputs = " ".join(
                text_of(o) for o in cell.find_elements("css selector", ".jp-OutputArea-output")
            )
            images = [
                i.get_attribute("src") or "" for i in cell.find_elements("css selector", ".jp-OutputArea img")
            ]
        except Exception:  # re-rendered under the query
            continue
        cells.append({"code": code, "output": outputs, "images": images})
    return cells


async def type_in_console(driver: Any, code: str) -> None:
    """Type ``code`` into the console's prompt and run it (Shift+Enter)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    prompt = await until(
        lambda: elements(driver, ".jp-CodeConsole-promptCell .cm-content"), "the console's prompt", driver
    )
    prompt[0].click()
    prompt[0].send_keys(code)
    ActionChains(driver).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()
