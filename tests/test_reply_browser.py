"""The Patient message panel in Debian's headless Chromium, inside the EHR's iframe: paste a
message, get the draft, open a cited sentence in the side panel, Copy and Save draft."""
from __future__ import annotations

import pytest

from .test_browser import CHROMIUM, PID, launch, servers  # noqa: F401  (the servers fixture)


@pytest.mark.browser
def test_paste_a_message_open_a_citation_and_copy_the_draft(servers):  # noqa: F811
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1220, "height": 720})
        frame = launch(page, servers, PID)
        frame.locator("#reply summary").click()
        frame.locator("#reply-message").fill("My son has bad allergies. Does he carry an EpiPen? "
                                             "Also, what did his pathology say about the appendix?")
        frame.locator("#reply-button").click()
        draft = frame.locator("#reply-draft")
        draft.wait_for(timeout=90_000)
        assert "DRAFT, not sent" in frame.locator("#reply-out .draft-title").inner_text()
        assert "I will check with your care team" in draft.inner_text()
        assert "pathology" in frame.locator("#reply-unanswered").inner_text()
        assert frame.locator("#reply-urgent").count() == 0
        evidence = frame.locator("#reply-evidence li").first.inner_text()
        mark = frame.locator("#reply-draft .reply-cite").first
        mark.click()
        frame.locator("#panel:not([hidden]) #panel-title").wait_for(timeout=10_000)
        assert frame.locator("#panel-ref").inner_text().split("/")[0] in ("DocumentReference", "MedicationRequest",
                                                                         "AllergyIntolerance", "Condition")
        # The cited sentence is what the panel marks in a note (a coded record shows its fields).
        if frame.locator("#panel-note:not([hidden])").count():
            assert frame.locator("#panel-note mark.quoted").first.inner_text().split()[0] in evidence
        frame.locator("#reply-copy").click()
        copied = frame.locator("#reply-copy-text").input_value()
        assert "I will check with your care team" in copied and "[1]" not in copied
        frame.locator("#reply-save").click()
        # Kept in the browser (its storage, or the window's memory where the EHR's iframe gets none).
        assert frame.locator("#reply-save").inner_text() in ("Saved in this browser only",
                                                              "Kept in this window only (the browser blocks storage here)")
        browser.close()
