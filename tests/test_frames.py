"""One patient per frame, in Chromium, as EHRs are used: several patient workspaces open side by
side, each with chartcite in its frame. Two tabs of one browser launch two patients from the EHR;
then every reload, back and restore, in either order, shows each frame its own patient or the
page that says to open chartcite from the EHR again, never the other tab's patient; and the API
refuses the other patient whatever a frame sends. Same-site (chartcite and the EHR on one site,
as hospitals deploy it: the browser keeps chartcite's cookies) and cross-site (the EHR on another
site: cookies are third-party)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from .test_browser import CHROMIUM
from .test_smart import OTHER, PID, stack  # noqa: F401  (the SMART stack: sekmet, the EHR, chartcite)

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-sync", "--disable-component-update"]
RELAUNCH = "Open chartcite from the EHR again"


def ehr_chart(stack, site: str, patient: str) -> str:
    """The EHR's chart page for a patient: on chartcite's site (localhost) or another (127.0.0.1)."""
    port = stack.ehr.rsplit(":", 1)[1]
    host = "localhost" if site == "same-site" else "127.0.0.1"
    return f"http://{host}:{port}/ehr?patient={patient}"


def chartcite_frame(stack, page):
    return next(f for f in page.frames if f.url.startswith(stack.app))


def open_chart(stack, context, site: str, patient: str):
    page = context.new_page()
    page.goto(ehr_chart(stack, site, patient))
    page.frame_locator("#app").locator("#ask-form[data-ready='yes']").wait_for(timeout=180_000)
    return page


def shown_patient(stack, page) -> str:
    """Whom the frame shows: the launch's patient ("" on the relaunch page). The banner is the
    record's own name for that patient, filled in from the server."""
    frame = chartcite_frame(stack, page)
    frame.wait_for_load_state()
    if RELAUNCH in (frame.locator("body").text_content() or ""):
        return ""
    frame.locator("#ask-form[data-ready='yes']").wait_for(timeout=60_000)
    status = frame.evaluate("""async () => {
        const handle = document.querySelector('meta[name="chartcite-session"]').content;
        const r = await fetch('/api/status', {headers: {'X-Chartcite-Session': handle}});
        return (await r.json()).patient_id;
    }""")
    meta = frame.locator('meta[name="chartcite-patient"]')
    assert not meta.count() or meta.get_attribute("content") == status, "the page and its session disagree"
    return status


def navigate(frame, script: str) -> None:
    """Run a navigating script after `evaluate` has returned: run inside it, the navigation may
    destroy the page's context before the result comes back, and Playwright raises (seen once on
    a fresh clone: "Execution context was destroyed")."""
    frame.evaluate(f"setTimeout(() => {{ {script}; }}, 0)")


def reload_frame(stack, page) -> None:
    frame = chartcite_frame(stack, page)
    with page.expect_event("framenavigated"):
        navigate(frame, "location.reload()")


def back_in_frame(stack, page) -> None:
    """Away from the frame's page and back, as the clinician's back button does inside the frame."""
    frame = chartcite_frame(stack, page)
    with page.expect_event("framenavigated"):
        navigate(frame, "location.assign('/launch/error')")
    with page.expect_event("framenavigated"):
        navigate(chartcite_frame(stack, page), "history.back()")


def api_refuses_the_other_patient(stack, page, other: str) -> None:
    """From this frame, with its own handle: the other patient's id in a query, a body, the
    frame's patient header or a record reference is refused."""
    frame = chartcite_frame(stack, page)
    codes = frame.evaluate("""async (other) => {
        const handle = document.querySelector('meta[name="chartcite-session"]').content;
        const mine = document.querySelector('meta[name="chartcite-patient"]').content;
        const h = {'X-Chartcite-Session': handle, 'X-Chartcite-Patient': mine, 'Content-Type': 'application/json'};
        const q = await fetch('/api/status?patient=' + other, {headers: h});
        const b = await fetch('/api/ask', {method: 'POST', headers: h, body: JSON.stringify({question: 'Any allergies?', patient_id: other})});
        const p = await fetch('/api/ask', {method: 'POST', headers: {...h, 'X-Chartcite-Patient': other}, body: JSON.stringify({question: 'Any allergies?'})});
        const r = await fetch('/api/record?ref=Patient/' + other, {headers: h});
        return [q.status, b.status, p.status, r.status];
    }""", other)
    assert codes == [403, 403, 409, 403], codes


ORDERS = {
    "reload the first tab, then the second": [("reload", 0), ("reload", 1)],
    "reload the second tab, then the first": [("reload", 1), ("reload", 0)],
    "back in the first tab, reload the second": [("back", 0), ("reload", 1)],
    "restore the first tab's frame in a new tab, reload the second": [("restore", 0), ("reload", 1)],
}


@pytest.mark.browser
@pytest.mark.parametrize("site", ["same-site", "cross-site"])
def test_each_frame_shows_only_its_own_patient(stack, site):  # noqa: F811
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is not installed: run `make install-test` (apt-get install chromium)")
    patients = [PID, OTHER]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            for order, steps in ORDERS.items():
                context = browser.new_context()
                tabs = [open_chart(stack, context, site, patient) for patient in patients]
                for tab, patient in zip(tabs, patients):
                    assert shown_patient(stack, tab) == patient
                for action, i in steps:
                    if action == "reload":
                        reload_frame(stack, tabs[i])
                    elif action == "back":
                        back_in_frame(stack, tabs[i])
                    else:      # a restored tab: the frame's own address opened again on its own
                        address = chartcite_frame(stack, tabs[i]).url
                        tabs[i].close()
                        tabs[i] = context.new_page()
                        tabs[i].goto(address)
                        assert shown_patient_or_relaunch(tabs[i], patients[i]), order
                        continue
                    assert shown_patient(stack, tabs[i]) in (patients[i], ""), f"{site}, {order}: step {action} {i}"
                for tab, patient in zip(tabs, patients):
                    if tab.frames[0].url.startswith(stack.app):
                        continue            # the restored frame, opened as a page of its own
                    assert shown_patient(stack, tab) in (patient, ""), f"{site}, {order}"
                    if shown_patient(stack, tab):
                        api_refuses_the_other_patient(stack, tab, next(p for p in patients if p != patient))
                context.close()
        finally:
            browser.close()


def shown_patient_or_relaunch(page, patient: str) -> bool:
    page.wait_for_load_state()
    text = page.locator("body").text_content() or ""
    if RELAUNCH in text:
        return True
    meta = page.locator('meta[name="chartcite-patient"]')
    return meta.count() == 1 and meta.get_attribute("content") == patient


def test_the_frame_address_of_a_launch_needs_its_own_cookie(stack):  # noqa: F811
    """Without a cookie for that very frame (another browser, an ended session, the old /app
    address), a frame address shows the relaunch page."""
    import requests

    from .test_smart import handle_of, launch

    final, _ = launch(stack, stack.test_api("launch", {"patient": PID})["launch"])
    frame_path = re.search(r'<meta name="chartcite-frame" content="([^"]+)"', final.text).group(1)
    handle = handle_of(final.text)
    assert RELAUNCH in requests.get(f"{stack.app}{frame_path}", timeout=10).text
    assert RELAUNCH in requests.get(f"{stack.app}/app", cookies={"chartcite_frame": handle}, timeout=10).text
    kept = requests.get(f"{stack.app}{frame_path}", cookies={"chartcite_frame": handle}, timeout=10)
    assert kept.status_code == 200 and f'name="chartcite-patient" content="{PID}"' in kept.text
    other_frame = requests.get(f"{stack.app}/app/another-frame-id", cookies={"chartcite_frame": handle}, timeout=10)
    assert RELAUNCH in other_frame.text
    headers = {"X-Chartcite-Session": handle}
    assert requests.post(f"{stack.app}/api/session/end", headers=headers, json={}, timeout=10).status_code == 200
    assert requests.get(f"{stack.app}/api/status", headers=headers, timeout=10).status_code == 401
    assert RELAUNCH in requests.get(f"{stack.app}{frame_path}", cookies={"chartcite_frame": handle}, timeout=10).text
