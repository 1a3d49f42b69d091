// The Patient message panel: paste a portal message, get a draft reply whose every sentence cites
// the record. The draft is never sent by chartcite: Copy puts it on the clipboard, Save draft keeps
// it in this browser's session storage only. Everything from the server is inserted as text.
(function () {
  "use strict";
  const frame = window.chartciteFrame;
  const $ = (id) => document.getElementById(id);
  if (!frame || !$("reply-form")) return;
  const storageKey = "chartcite-reply-draft:" + frame.patientId;
  const kept = {};

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    Object.entries(attrs || {}).forEach(([k, v]) => node.setAttribute(k, v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function mark(n, evidence) {
    const button = el("button", { type: "button", class: "cite reply-cite", "data-n": String(n) }, "[" + n + "]");
    const item = evidence.find((e) => e.n === n);
    if (item) button.addEventListener("click", () => frame.openRecord(item.ref, [item.text]));
    return button;
  }

  // The draft as the patient will read it: without the clinician's [n] marks.
  function plainDraft(result) {
    return result.sentences.map((s) => s.text).join(" ");
  }

  function render(result) {
    const out = $("reply-out");
    out.textContent = "";
    if (result.urgent) {
      out.appendChild(el("div", { class: "reply-urgent", id: "reply-urgent", role: "alert" },
        "URGENT: the message describes " + result.urgent_signs.join(", ") +
        ". The draft opens with the urgent instructions; consider calling the patient."));
    }
    out.appendChild(el("h4", { class: "draft-title" }, "Reply — DRAFT, not sent by chartcite"));
    const draft = el("p", { id: "reply-draft", class: "reply-draft" });
    result.sentences.forEach((s) => {
      draft.appendChild(el("span", { class: "reply-sentence reply-" + s.kind }, s.text));
      s.citations.forEach((n) => { draft.appendChild(document.createTextNode(" ")); draft.appendChild(mark(n, result.evidence)); });
      draft.appendChild(document.createTextNode(" "));
    });
    out.appendChild(draft);
    if (result.unanswered.length) {
      out.appendChild(el("h4", {}, "Not answered from the record (the draft says you will check with the care team)"));
      const list = el("ul", { id: "reply-unanswered" });
      result.unanswered.forEach((q) => list.appendChild(el("li", {}, q)));
      out.appendChild(list);
    }
    if (result.evidence.length) {
      out.appendChild(el("h4", {}, "Evidence sentences (score)"));
      const list = el("ol", { id: "reply-evidence", class: "reply-evidence" });
      result.evidence.forEach((e) => {
        const row = el("li", { value: String(e.n) });
        const open = el("button", { type: "button", class: "link small" },
                        e.score.toFixed(2) + " · " + (e.date || "") + " · " + e.text);
        open.addEventListener("click", () => frame.openRecord(e.ref, [e.text]));
        row.appendChild(open);
        list.appendChild(row);
      });
      out.appendChild(list);
    }
    const copy = el("button", { type: "button", id: "reply-copy" }, "Copy");
    const box = el("textarea", { id: "reply-copy-text", readonly: "readonly", rows: "3", hidden: "hidden" });
    box.value = plainDraft(result);
    copy.addEventListener("click", () => {
      box.hidden = false; box.select();
      const done = () => { copy.textContent = "Copied — paste it into your reply"; };
      if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(box.value).then(done, () => { document.execCommand("copy"); done(); });
      else { document.execCommand("copy"); done(); }
    });
    const save = el("button", { type: "button", id: "reply-save" }, "Save draft");
    save.addEventListener("click", () => {
      // An EHR's iframe is another site's: the browser may refuse it storage. The draft then stays
      // in this window's memory until it closes; either way it never leaves the browser.
      kept[storageKey] = box.value;
      try {
        window.sessionStorage.setItem(storageKey, box.value);
        save.textContent = "Saved in this browser only";
      } catch (e) { save.textContent = "Kept in this window only (the browser blocks storage here)"; }
    });
    out.appendChild(copy); out.appendChild(save); out.appendChild(box);
  }

  // A launch from the EHR's message view carries the message: it is filled in, once, for reading.
  let asked = false;
  $("reply").addEventListener("toggle", () => {
    if (!$("reply").open || asked) return;
    asked = true;
    frame.get("/api/reply/launch-message").then(({ ok, body }) => {
      if (ok && body.message && !$("reply-message").value) $("reply-message").value = body.message;
    });
  });

  $("reply-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const message = $("reply-message").value.trim();
    const out = $("reply-out");
    if (!message) { out.textContent = "Paste the patient's message first."; return; }
    out.textContent = "Reading the message and the record…";
    $("reply-button").disabled = true;
    frame.post("/api/reply", { message: message }).then(({ ok, body }) => {
      $("reply-button").disabled = false;
      if (!ok) { out.textContent = body.error || "The draft could not be made."; return; }
      render(body);
    });
  });
})();
