"""The web console in a real headless Chromium, against a real broker: it shows topics and a group's
lag, follows the group as it catches up, says when the broker is gone, and changes nothing.

``ORDERLYMQ_CONSOLE_SCREENSHOT=docs/console.png`` keeps the screenshot of the first test there (the
one in the docs); otherwise it goes to the test's temp dir.
"""

from __future__ import annotations

import http.client
import os
import urllib.error
import urllib.request

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from connector.client import Admin, Producer, PullConsumer

GROUP = "billing"
WAIT_S = 30  # an upper bound for a loaded machine, not a measurement: the test waits for the DOM


def texts_of(driver, css: str) -> list[str]:
    """The text of every element ``css`` selects, read again when the page re-rendered between
    finding and reading (it does on every refresh)."""
    for _ in range(10):
        try:
            return [element.text for element in driver.find_elements(By.CSS_SELECTOR, css)]
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"{css} kept being replaced while it was read")


def text_of(driver, css: str) -> str | None:
    found = texts_of(driver, css)
    return found[0] if found else None


def wait_for_text(driver, css: str, expected: str) -> None:
    WebDriverWait(driver, WAIT_S).until(lambda d: text_of(d, css) == expected,
                                        message=f"{css} never showed {expected!r}")


def group_lag(admin: Admin, topic: str) -> int:
    return sum(row.lag for row in admin.consumer_progress(GROUP, topic))


def send_keyed(producer: Producer, topic: str, count: int) -> None:
    for f in [producer.send_async(topic, f"{i}".encode(), key=f"order-{i % 7}") for i in range(count)]:
        f.result(timeout=30)


def test_console_shows_topic_and_follows_the_lag_of_a_group_catching_up(
    broker, console_of, chromium, topic_name, tmp_path
):
    with Admin(broker.address) as admin, PullConsumer(broker.address, group=GROUP) as consumer, \
            Producer(broker.address, retry_timeout=10.0) as producer:
        admin.create_topic(topic_name, 2)
        send_keyed(producer, topic_name, 60)
        export = producer.transaction("nightly-export").begin()
        export.send(topic_name, b"staged", key="order-1")
        ends = {s.queue_id: s.max_offset for s in admin.topic_status(topic_name)}
        for queue_id in ends:
            consumer.lock(topic_name, queue_id)
            consumer.commit(topic_name, queue_id, ends[queue_id] // 3)
        console = console_of(broker.address)
        chromium.get(console.url)
        lag_css = f'[data-group="{GROUP}"] [data-role="group-lag"]'
        wait_for_text(chromium, lag_css, str(group_lag(admin, topic_name)))
        assert chromium.find_elements(By.CSS_SELECTOR, f'#topics tr[data-topic="{topic_name}"]')
        assert text_of(chromium, "#status") == "SERVING"
        wait_for_text(chromium, "#transactions tbody td", "nightly-export")

        # The group catches up in two steps, and new traffic arrives: the page follows each change.
        for fraction in (2, 1):
            for queue_id, end in ends.items():
                consumer.commit(topic_name, queue_id, end * fraction // 3 if fraction == 2 else end)
            wait_for_text(chromium, lag_css, str(group_lag(admin, topic_name)))
        assert group_lag(admin, topic_name) == 0
        send_keyed(producer, topic_name, 20)
        wait_for_text(chromium, lag_css, "20")

        WebDriverWait(chromium, WAIT_S).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, f'#lag-chart path[data-series="{GROUP}"]')
            and d.find_elements(By.CSS_SELECTOR, f'#rate-chart path[data-series="{topic_name}"]'),
            message="the lag and throughput charts never drew their series",
        )
        holders = {text.split()[3] for text in texts_of(chromium, "#locks tbody tr")}
        assert holders == {consumer.client_id}
        screenshot = os.environ.get("ORDERLYMQ_CONSOLE_SCREENSHOT") or str(tmp_path / "console.png")
        assert chromium.save_screenshot(screenshot)
        export.abort()
        wait_for_text(chromium, "#transactions tbody td", "no open transaction")


def test_console_says_when_the_broker_is_unreachable(broker_factory, console_of, chromium):
    broker = broker_factory()
    console = console_of(broker.address)
    chromium.get(console.url)
    wait_for_text(chromium, "#status", "SERVING")
    broker.stop()
    wait_for_text(chromium, "#status", "UNREACHABLE")
    problem = text_of(chromium, "#problem")
    assert f"Cannot read the broker at {broker.address}" in problem and "Traceback" not in problem


def broker_view(admin: Admin, topic: str) -> tuple:
    """Everything a console could have changed."""
    return (admin.list_topics(), admin.topic_status(topic), admin.groups(), admin.open_transactions())


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_console_refuses_every_method_but_get(broker, console_of, topic_name, method):
    with Admin(broker.address) as admin:
        admin.create_topic(topic_name, 1)
        admin.reset_offset(GROUP, topic_name, 0, 0)
        console = console_of(broker.address)
        before = broker_view(admin, topic_name)
        for path in ("", "api/state", f"api/topics/{topic_name}"):
            request = urllib.request.Request(console.url + path, method=method, data=b'{"offset": 99}')
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=10)
            assert refused.value.code == 405 and refused.value.headers["Allow"] == "GET, HEAD"
        assert broker_view(admin, topic_name) == before


def test_console_refuses_a_request_for_another_host(broker, console_of):
    """A page elsewhere whose DNS name was rebound to loopback cannot read the console."""
    console = console_of(broker.address)
    port = int(console.url.rsplit(":", 1)[1].strip("/"))
    answers = {}
    for host in ("evil.example", f"evil.example:{port}", f"localhost:{port}", f"127.0.0.1:{port}"):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("GET", "/api/state", headers={"Host": host})
        answers[host] = connection.getresponse().status
        connection.close()
    assert answers == {"evil.example": 403, f"evil.example:{port}": 403, f"localhost:{port}": 200,
                       f"127.0.0.1:{port}": 200}
