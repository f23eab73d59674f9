"""Farama's MiniWoB++ envs in Debian's headless Chromium, with a driver that never downloads anything.

miniwob 1.1 reads `MINIWOB_CHROME_BINARY` and `MINIWOB_CHROMEDRIVER` but launches Chromium with only
`headless disable-gpu no-sandbox`; we subclass its Selenium instance to add the flags that keep a headless
browser quiet offline, to hand Selenium the driver path (so Selenium Manager never runs), and to bound every
WebDriver command with a timeout.
"""

from __future__ import annotations

import os
import shutil
import urllib.parse

from miniwob.environment import MiniWoBEnvironment
from miniwob.fields import get_field_extractor
from miniwob.selenium_instance import DEFAULT_BASE_URL, HTML_DIR, SeleniumInstance
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.wait import WebDriverWait

CHROME_BINARY = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROME_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--no-first-run",
    "--no-default-browser-check",
    "--mute-audio",
)
COMMAND_TIMEOUT_S = 20.0  # one WebDriver/CDP round trip; a hung browser raises instead of blocking forever
SCRIPT_TIMEOUT_S = 10.0
PAGE_LOAD_TIMEOUT_S = 20.0

os.environ.setdefault("MINIWOB_CHROME_BINARY", CHROME_BINARY)
os.environ.setdefault("MINIWOB_CHROMEDRIVER", CHROMEDRIVER)


def browser_paths() -> tuple[str, str]:
    """The Chromium and ChromeDriver executables to use, from `MINIWOB_CHROME_BINARY` / `MINIWOB_CHROMEDRIVER`."""
    chrome = os.environ.get("MINIWOB_CHROME_BINARY") or CHROME_BINARY
    driver = os.environ.get("MINIWOB_CHROMEDRIVER") or CHROMEDRIVER
    return chrome, driver


def check_task(task: str) -> None:
    """Raise ValueError unless `task` is a MiniWoB task whose page ships with miniwob (flight.* tasks excluded)."""
    if not (HTML_DIR / "miniwob" / f"{task}.html").is_file():
        raise ValueError(f"no MiniWoB task {task!r}: use a page name from {HTML_DIR / 'miniwob'}, e.g. 'click-button'")


def browser_available() -> bool:
    """Whether both Chromium and ChromeDriver are installed (Debian packages `chromium`, `chromium-driver`)."""
    chrome, driver = browser_paths()
    return all(os.access(p, os.X_OK) or shutil.which(p) for p in (chrome, driver))


class _Instance(SeleniumInstance):
    def create_driver(self) -> None:
        chrome, chromedriver = browser_paths()
        if not browser_available():
            raise RuntimeError(
                f"Chromium or ChromeDriver not found ({chrome}, {chromedriver}): install the Debian packages "
                "`chromium` and `chromium-driver` (`make browser`), or point MINIWOB_CHROME_BINARY and "
                "MINIWOB_CHROMEDRIVER at your binaries"
            )
        options = webdriver.ChromeOptions()
        options.binary_location = chrome
        for flag in CHROME_FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--window-size={self.window_width},{self.window_height}")
        self.driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
        self.driver.command_executor.client_config.timeout = COMMAND_TIMEOUT_S
        self.driver.set_script_timeout(SCRIPT_TIMEOUT_S)
        self.driver.set_page_load_timeout(PAGE_LOAD_TIMEOUT_S)
        self.open_page()
        self.inner_width, self.inner_height = self.driver.execute_script("return [window.innerWidth, window.innerHeight];")

    def open_page(self) -> None:
        self.driver.get(self.url)
        try:
            WebDriverWait(self.driver, 5).until(expected_conditions.element_to_be_clickable((By.ID, self.SYNC_SCREEN_ID)))
        except TimeoutException as e:
            raise RuntimeError(f"MiniWoB page {self.url} did not load in 5 s") from e


class MiniWoBBrowserEnv(MiniWoBEnvironment):
    """A MiniWoB++ task (`subdomain`, e.g. "click-button") in headless Debian Chromium, screenshots off."""

    def __init__(self, subdomain: str, **kwargs):
        check_task(subdomain)
        super().__init__(subdomain=subdomain, **kwargs)

    def _hard_reset_instance(self) -> None:
        if getattr(self, "instance", None):
            self.instance.close()
        self.instance = _Instance(index=0, **self.instance_kwargs)
        self.instance.start()
        self.instance.record_screenshots = False

    @property
    def driver(self) -> webdriver.Chrome:
        return self.instance.driver

    def load_task(self, task: str) -> None:
        """Open another MiniWoB task's page in the same browser."""
        check_task(task)
        self.subdomain = self.instance_kwargs["subdomain"] = task
        self.instance.url = urllib.parse.urljoin(self.instance_kwargs["base_url"] or DEFAULT_BASE_URL, f"{task}.html")
        self.instance.field_extractor = get_field_extractor(task)
        self.instance.open_page()

    def restart(self) -> None:
        """Quit the browser (dead or alive) and start a fresh one on the same task."""
        self._hard_reset_instance()
