"""``kmq ui`` as a real process, used from a real headless browser, against a real
tracker, consumer and broker: overview = ``kmq status``, the DLQ browser, redrive,
the trace view, escaping, and the token rule."""

from __future__ import annotations

import base64
import urllib.error
import urllib.request

import pytest
from click.testing import CliRunner

from kmq.cli import cli
from tests.helpers.browser import element_text, screenshot, start_browser
from tests.helpers.cli import status_rows
from tests.helpers.kafka import produce, wait_until
from tests.helpers.settling_worker import SettlingWorker
from tests.helpers.ui import UiProcess
from tests.integration.tracker_util import metric, running_tracker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HTML_PAYLOAD = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script><b>bold</b>'


def _get(url: str, headers: dict | None = None) -> int:
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30).status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_beyond_loopback_a_token_is_required(make_config, tmp_path):
    cfg = make_config()
    res = CliRunner().invoke(cli, ["ui", "--host", "127.0.0.2", "--bootstrap", cfg.kafka.bootstrap_servers],
                             env={"KMQ_UI_TOKEN": ""})
    assert res.exit_code == 1 and "without a token: set KMQ_UI_TOKEN" in res.output, res.output
    ui = UiProcess(cfg, tmp_path, "--host", "127.0.0.2", env={"KMQ_UI_TOKEN": "s3cret-token"})
    try:
        base = f"http://127.0.0.2:{ui.wait_port()}"
        assert _get(f"{base}/healthz") == 200  # probes need no token and see no data
        assert _get(f"{base}/static/style.css") == 401
        assert _get(f"{base}/dlq") == 401
        assert _get(f"{base}/", {"Authorization": "Bearer wrong"}) == 401
        basic = base64.b64encode(b"anyone:s3cret-token").decode()
        assert _get(f"{base}/static/style.css", {"Authorization": f"Basic {basic}"}) == 200
        assert _get(f"{base}/trace", {"Authorization": "Bearer s3cret-token"}) == 200
    finally:
        ui.close()
    # On loopback no token is needed, but only loopback Host names are served (DNS rebinding).
    ui = UiProcess(cfg, tmp_path)
    try:
        base = f"http://127.0.0.1:{ui.wait_port()}"
        assert _get(f"{base}/trace") == 200
        assert _get(f"{base}/trace", {"Host": "attacker.example"}) == 421
    finally:
        ui.close()


class Application:
    """Acks "ok-*", rejects "poison" and "html" (a redriven copy is acked), holds "held"
    under a renewed lease (on the worker's thread)."""

    def __init__(self) -> None:
        self.acked: set[str] = set()
        self.rejected: set[str] = set()
        self.held = []

    def settle(self, msg) -> None:
        key = msg.key.decode()
        first = msg.origin == f"{msg.topic}/{msg.partition}/{msg.offset}"
        if key in ("poison", "html") and first:
            msg.reject("bad payload")
            self.rejected.add(key)
        elif key == "held":
            msg.renew(120.0)
            self.held.append(msg)
        else:
            msg.ack()
            self.acked.add(key)


def _status_rows(cfg, q) -> dict:
    res = CliRunner().invoke(cli, ["status", q.name, "--bootstrap", cfg.kafka.bootstrap_servers,
                                   "--workers-group", cfg.consumer.group_id, "--tracker-group", cfg.tracker.group_id])
    assert res.exit_code == 0, res.output
    return status_rows(res.output)


def _seconds(text: str) -> float:
    if text == "-":
        return 0.0
    unit = {"s": 1, "m": 60, "h": 3600}[text[-1]]
    return float(text[:-1]) * unit


def _ui_rows(driver) -> dict:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    out = {}
    try:
        for tr in driver.find_elements(By.CSS_SELECTOR, "#partitions tbody tr"):
            cells = [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
            out[cells[0]] = cells[1:]
    except StaleElementReferenceException:  # the table was swapped meanwhile: read it again next time
        return {}
    return out


def _same_figures(ui: dict, status: dict) -> bool:
    """Equal, with the oldest in-flight age (it grows while we look) within 3 s."""
    if ui.keys() != status.keys():
        return False
    for p, row in status.items():
        u = ui[p]
        if [u[0], *u[2:]] != [row[0], *row[2:]] or abs(_seconds(u[1]) - _seconds(row[1])) > 3:
            return False
    return True


def test_console_in_a_real_browser(bootstrap, queue_topics, tmp_path):
    from selenium.webdriver.common.by import By

    cfg, q = queue_topics(2, queue={"lease": "30s"}, tracker={"tick": "50ms"},
                          consumer={"ack_flush_interval": "50ms"})
    produce(bootstrap, q.name, 6, keys=b"ok-%d", values=b"fine", partitions=2, flush_each=True)
    (poison,) = produce(bootstrap, q.name, keys=[b"poison"], values=b'{"amount": "NaN"}', partition=1,
                        headers=[("trace-id", b"abc123")])
    produce(bootstrap, q.name, keys=[b"html", b"held"], values=[HTML_PAYLOAD.encode(), b"slow"], flush_each=True)
    origin = f"{q.name}/1/{poison.offset}"
    driver = None
    with running_tracker(cfg) as t:
        app = Application()
        w = SettlingWorker(cfg, q.name, app.settle)
        ui = UiProcess(cfg, tmp_path, "--tracker-url", f"http://127.0.0.1:{t.http_port}",
                       "--workers-group", cfg.consumer.group_id, "--tracker-group", cfg.tracker.group_id)
        try:
            base = f"http://127.0.0.1:{ui.wait_port()}"
            wait_until(lambda: len(app.acked) == 6 and app.rejected == {"poison", "html"} and app.held, 40,
                       what="the application handled every message")
            wait_until(lambda: metric(t.http_port, "kmq_tracker_dead_lettered_total", queue=q.name) == 2, 20,
                       what="two dead letters")
            wait_until(lambda: metric(t.http_port, "kmq_tracker_in_flight", queue=q.name) == 1, 20,
                       what="only the held message in flight")
            driver = start_browser(tmp_path / "chromium-profile")

            # Overview: the figures `kmq status` shows for the same queue, and the tracker's readiness.
            def overview_matches():
                before = _status_rows(cfg, q)
                driver.get(f"{base}/?queue={q.name}")
                shown = _ui_rows(driver)
                after = _status_rows(cfg, q)  # steady: the same counts after as before
                steady = all([a[0], *a[2:]] == [b[0], *b[2:]] for a, b in zip(after.values(), before.values()))
                return steady and _same_figures(shown, before) and shown

            shown = wait_until(overview_matches, 30, interval=0.5, what="overview equal to kmq status")
            assert shown["total"][0] == "1" and shown["total"][-1] == "2" and shown["0"][0] == "1"
            assert driver.find_element(By.ID, "tracker-ready").text == "ready"
            assert driver.find_element(By.ID, "dead-lettered").text == "2"
            screenshot(driver, tmp_path, "ui-overview.png")

            # DLQ browser: the poisoned message with its reason; HTML in a payload is text.
            driver.get(f"{base}/dlq?queue={q.name}")
            rows = {r.get_attribute("data-key"): r for r in driver.find_elements(By.CSS_SELECTOR, "tr.dead-letter")}
            assert rows.keys() == {"poison", "html"}
            reason = rows["poison"].find_element(By.CSS_SELECTOR, "td.reason").text
            assert reason.splitlines() == ["rejected", "bad payload"]
            assert rows["poison"].find_element(By.CSS_SELECTOR, "td.payload").text == '{"amount": "NaN"}'
            assert rows["html"].find_element(By.CSS_SELECTOR, "td.payload").text == HTML_PAYLOAD
            assert not rows["html"].find_elements(By.CSS_SELECTOR, "td.payload img, td.payload script, td.payload b")
            assert driver.execute_script("return window.__xss === undefined")
            rows["poison"].find_element(By.TAG_NAME, "summary").click()
            assert "abc123" in rows["poison"].find_element(By.CSS_SELECTOR, "td.headers").text
            screenshot(driver, tmp_path, "ui-dlq.png")
            # Filters: by reason and key.
            driver.find_element(By.NAME, "key").send_keys("poison")
            driver.find_element(By.CSS_SELECTOR, "#filters button").click()
            wait_until(lambda: element_text(driver, "count").startswith("1 of 2"), 10, what="key filter")

            # Redrive the ticked row: a dry-run count, a confirmation, then the move.
            driver.find_element(By.CSS_SELECTOR, 'tr.dead-letter[data-key="poison"] input[type=checkbox]').click()
            driver.find_element(By.ID, "redrive-selected").click()
            dry = wait_until(lambda: driver.find_elements(By.ID, "dry-run"), 30, what="dry-run page")[0]
            assert dry.text.startswith("1 dead letter(s) would be moved back")
            screenshot(driver, tmp_path, "ui-redrive-confirm.png")
            assert len(app.acked) == 6  # a dry run moves nothing
            driver.find_element(By.ID, "confirm").click()
            result = wait_until(lambda: driver.find_elements(By.ID, "result"), 30, what="redrive result")[0]
            assert result.text.startswith("moved 1 dead letter(s) back")
            wait_until(lambda: "poison" in app.acked, 30, what="the redriven copy acked")
            w.consumer.writer.flush()
            # The same selection again: nothing left to move, nothing copied twice.
            driver.get(f"{base}/dlq?queue={q.name}&key=poison")
            driver.find_element(By.CSS_SELECTOR, 'tr.dead-letter[data-key="poison"] input[type=checkbox]').click()
            driver.find_element(By.ID, "redrive-selected").click()
            dry = wait_until(lambda: driver.find_elements(By.ID, "dry-run"), 30, what="second dry run")[0]
            assert dry.text.startswith("0 dead letter(s)") and "1 more matching" in dry.text
            assert driver.find_element(By.ID, "confirm").get_attribute("disabled") is not None

            # Trace view, from the dead letter's link: the whole history.
            driver.get(f"{base}/dlq?queue={q.name}&key=poison")
            driver.find_element(By.CSS_SELECTOR, 'tr.dead-letter[data-key="poison"] a.trace-link').click()

            def traced():
                secs = driver.find_elements(By.CSS_SELECTOR, "section.trace")
                if secs and secs[0].find_element(By.CLASS_NAME, "final-state").text == "acked":
                    return secs[0]
                driver.refresh()
                return None

            sec = wait_until(traced, 30, interval=0.5, what="trace page shows the message acked")
            assert sec.get_attribute("data-origin") == origin
            kinds = [e.get_attribute("data-kind") for e in sec.find_elements(By.CSS_SELECTOR, "tr.event")]
            assert kinds == ["delivered", "start", "reject", "dead-lettered", "closed", "delivered", "start", "ack"]
            text = sec.text
            assert "REJECT: bad payload" in text and "dead letter, reason rejected (bad payload)" in text
            assert "delivery 1 (redriven from the DLQ)" in text
            screenshot(driver, tmp_path, "ui-trace.png")

            # Redrive by filter (reason + key): the dry run counts what the confirmation then moves.
            driver.get(f"{base}/dlq?queue={q.name}&reason=rejected&key=html")
            driver.find_element(By.ID, "redrive-filter").click()
            dry = wait_until(lambda: driver.find_elements(By.ID, "dry-run"), 30, what="filter dry run")[0]
            assert dry.text.startswith("1 dead letter(s) would be moved back")
            driver.find_element(By.ID, "confirm").click()
            result = wait_until(lambda: driver.find_elements(By.ID, "result"), 30, what="filter redrive")[0]
            assert result.text.startswith("moved 1 dead letter(s) back")
            wait_until(lambda: "html" in app.acked, 30, what="the redriven html message acked")
        finally:
            if driver is not None:
                driver.quit()
            ui.close()
            w.close()
    for name in ("ui-overview.png", "ui-dlq.png", "ui-redrive-confirm.png", "ui-trace.png"):
        assert (tmp_path / name).stat().st_size > 10_000
