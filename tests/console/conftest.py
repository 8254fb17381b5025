"""Fixtures of the console tests: a console server on a free port, and headless Debian Chromium."""

from __future__ import annotations

import shutil

import pytest

from connector.console import ConsoleServer

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture
def console_of():
    """Start consoles of a broker address: ``console_of(broker.address)``; closed after the test."""
    started = []

    def start(brokers: str, interval: float = 0.25) -> ConsoleServer:
        server = ConsoleServer(brokers, port=0, interval=interval).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


@pytest.fixture(scope="module")
def chromium():
    """A headless Chromium driven through chromedriver (Debian's packages, which make test installs)."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if shutil.which(p) is None]
    if missing:  # a machine without the browser must not pass silently
        pytest.fail(f"the console tests need {' and '.join(missing)}: make browser (apt-get install chromium "
                    "chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1280,1500"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    yield driver
    driver.quit()
