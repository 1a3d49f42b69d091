// The frame: progress while the record indexes, questions, cited answers, chips and the side panel.
// Everything from the server is inserted as text, never as HTML.
(function () {
  "use strict";
  const handle = document.querySelector('meta[name="chartcite-session"]').content;
  const $ = (id) => document.getElementById(id);

  // After a SMART callback the address bar holds the one-time code: replace it with a clean URL.
  if (window.location.pathname === "/callback") window.history.replaceState(null, "", "/app");

  // The EHR's smart_style_url colours (checked server-side) become the frame's CSS variables.
  const styleNames = { color_highlight: "--accent", color_background: "--bg", color_error: "--warn",
                       dim_border_radius: "--radius" };
  document.querySelectorAll('meta[name="ehr-style"]').forEach((m) => {
    const variable = styleNames[m.dataset.name];
    if (variable) document.documentElement.style.setProperty(variable, m.content);
  });

  function api(path, options) {
    options = options || {};
    options.headers = Object.assign({ "X-Chartcite-Session": handle }, options.headers || {});
    // Every answer becomes {ok, status, body}: a page that is not JSON (a proxy's 502) or no answer
    // at all (network down) is an error the frame can show, never a promise left hanging.
    return fetch(path, options)
      .then((r) => r.text().then((text) => {
        try { return { ok: r.ok, status: r.status, body: JSON.parse(text) }; } catch (e) {
          return { ok: false, status: r.status, body: { error: "chartcite answered with an error (HTTP " + r.status + "). Try again." } };
        }
      }))
      .catch(() => ({ ok: false, status: 0, body: { error: "chartcite could not be reached. Check the connection and try again." } }));
  }

  // A JSON POST through api(): the one place the request is built.
  function post(path, payload) {
    return api(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(payload) });
  }

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    Object.entries(attrs || {}).forEach(([k, v]) => node.setAttribute(k, v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // --- indexing progress -------------------------------------------------------------------
  let ready = false;
  function pollStatus() {
    api("/api/status").then(({ ok, status, body }) => {
      if (!ok) { if (status === 0 || status >= 500) setTimeout(pollStatus, 2000); return; }
      fillBanner(body.banner || {});
      const job = body.job;
      const active = job && (job.state === "queued" || job.state === "running");
      ready = body.indexed && !active;
      // A finished sync may still have something to say ("2 notes could not be read from the EHR").
      const notice = job && job.state === "done" && job.message;
      $("sync").hidden = ready && !(job && job.state === "failed") && !notice;
      if (notice) { $("sync-text").textContent = job.message; $("sync-bar").style.width = "100%"; }
      if (job && job.state === "failed") {
        $("sync-text").textContent = "Indexing failed (" + (job.message || "error") + "). Reopen the patient to retry.";
      } else if (active) {
        let what = "Indexing this patient's record: reading resources…";
        if (job.phase === "fetching" && job.total) what = "Fetching the record from the EHR: " + job.done + " of " + job.total + " kinds of record";
        if (job.phase === "essentials") what = "Indexing problems, medications and allergies first…";
        if (job.phase === "embedding" && job.total) what = "Indexing this patient's record: " + job.done + " of " + job.total + " passages embedded";
        $("sync-text").textContent = what + (body.indexed
          ? " — you can ask now; results, notes and visits still syncing may be missing from answers" : "");
        $("sync-bar").style.width = (job.percent || 2) + "%";
      }
      $("ask-button").disabled = !body.indexed;
      $("ask-form").dataset.ready = ready ? "yes" : "no";
      if (!ready) setTimeout(pollStatus, 1000);
    }).catch(() => setTimeout(pollStatus, 2000));
  }

  // A first launch renders before the record is indexed: the banner fills in from the status.
  function fillBanner(b) {
    if (b.name) $("banner-name").textContent = b.name;
    if (b.age !== null && b.age !== undefined) $("banner-age").textContent = b.age + " y";
    if (b.gender) $("banner-gender").textContent = b.gender;
    if (b.birth_date) $("banner-dob").textContent = "DOB " + b.birth_date;
  }

  $("resync").addEventListener("click", () => {
    post("/api/sync", {}).then(({ ok, body }) => {
      if (!ok) { $("sync").hidden = false; $("sync-text").textContent = body.error || "The refresh could not be started."; return; }
      ready = false; $("ask-form").dataset.ready = "no"; pollStatus();
    });
  });

  // A statement with its [n] marks, each opening the record it cites.
  function citedParagraph(text, citations) {
    const p = el("p", { class: "statement" }, text + " ");
    citations.forEach((n) => {
      const mark = el("a", { class: "cite", href: "#", "data-n": String(n) }, "[" + n + "]");
      mark.addEventListener("click", (e) => { e.preventDefault(); openCitation(n); });
      p.appendChild(mark);
    });
    return p;
  }

  // --- summary drafts: shown for reading, saved only on "Save draft" -----------------------------
  let currentDraft = null;
  function renderDraft(draft) {
    currentDraft = draft;
    current = { citations: draft.citations };
    const answer = $("answer");
    answer.textContent = "";
    $("chips").textContent = ""; $("chart").hidden = true; $("trail").hidden = true;
    answer.appendChild(el("h3", { class: "draft-title" }, draft.title + " — DRAFT, not saved"));
    draft.sections.forEach((section) => {
      answer.appendChild(el("h4", { class: "draft-section" }, section.title));
      if (!section.lines.length) answer.appendChild(el("p", { class: "muted small" }, "nothing to report"));
      section.lines.forEach((line) => answer.appendChild(citedParagraph(line.text, line.citations)));
    });
    const save = el("button", { type: "button", id: "save-draft" }, "Save draft");
    save.addEventListener("click", () => {
      post("/api/draft/save", { draft: currentDraft })
        .then(({ ok, body }) => {
          $("meta").textContent = ok ? "Draft saved (#" + body.saved + ")." : (body.error || "Not saved.");
          if (ok && draft.can_write_back) offerWriteBack(body.saved);
        });
    });
    answer.appendChild(save);
    $("meta").textContent = "Every line cites the record it came from. Nothing is saved until you press Save draft.";
  }
  function offerWriteBack(saved) {
    const write = el("button", { type: "button", id: "write-back" }, "Write to the EHR as a preliminary note");
    write.addEventListener("click", () => {
      post("/api/draft/writeback", { saved })
        .then(({ ok, body }) => { $("meta").textContent = ok ? "Written to the EHR as " + body.document + " (preliminary)." : (body.error || "Not written."); });
    });
    $("answer").appendChild(write);
  }

  ["draft-previsit", "draft-medreview"].forEach((id) => {
    $(id).addEventListener("click", () => {
      $("answer").textContent = "Drafting…";
      post("/api/draft", { kind: $(id).dataset.kind })
        .then(({ ok, body }) => { if (ok) renderDraft(body); else showError(body.error || "Could not draft."); });
    });
  });

  // --- asking ------------------------------------------------------------------------------
  let current = null;
  $("ask-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const question = $("question").value.trim();
    if (!question) return;
    $("answer").textContent = "Searching the record…";
    $("chips").textContent = ""; $("meta").textContent = ""; $("chart").hidden = true;
    $("ask-button").disabled = true;
    // The pipeline selector is a developer setting (CHARTCITE_SHOW_PIPELINE); clinicians get `full`.
    const payload = $("pipeline") ? { question, pipeline: $("pipeline").value } : { question };
    post("/api/ask", payload).then(({ ok, body }) => {
      $("ask-button").disabled = false;
      if (!ok) { showError(body.error || "Something went wrong. Try again."); return; }
      current = body;
      renderAnswer(body);
    });
  });

  function showError(message) {
    const answer = $("answer");
    answer.textContent = "";
    answer.appendChild(el("p", { class: "error", role: "alert" }, message));
  }

  function renderAnswer(result) {
    const answer = $("answer");
    answer.textContent = "";
    if (result.banner) {
      answer.appendChild(el("p", { class: "banner-general" }, result.banner));
      answer.appendChild(el("p", { class: "statement general" }, result.answer));
    } else if (result.abstained) {
      // An abstention may list what the record holds of the asked class: the lead, then each entry cited.
      answer.appendChild(el("p", { class: "abstain" }, result.lead || result.answer));
    }
    result.statements.forEach((s) => answer.appendChild(citedParagraph(s.text, s.citations)));
    const chips = $("chips");
    result.citations.forEach((c) => {
      const chip = el("button", { type: "button", class: "chip", "data-ref": c.ref });
      chip.appendChild(el("b", {}, String(c.n)));
      chip.appendChild(document.createTextNode(c.label));
      chip.addEventListener("click", () => openCitation(c.n));
      chips.appendChild(chip);
    });
    const level = el("span", { class: "confidence confidence-" + result.confidence }, "confidence: " + result.confidence);
    const meta = $("meta");
    meta.textContent = "";
    meta.appendChild(level);
    let more = " · pipeline: " + result.diagnostics.pipeline + " · " + (result.generator === "extractive"
      ? "extractive answer" : "written by " + result.generator + ", every statement verified");
    if (result.removed_statements) more += " · " + result.removed_statements + " unsupported statement(s) removed";
    if (result.generator_note) more += " · " + result.generator_note;
    meta.appendChild(document.createTextNode(more));
    renderChart(result.chart);
    renderTrail(result.diagnostics.stages);
  }

  function renderTrail(stages) {
    const body = $("trail-table").querySelector("tbody");
    body.textContent = "";
    stages.forEach((s) => {
      const row = el("tr");
      [s.name, s.in, s.out, s.corpus_ratio.toFixed(3), s.ms.toFixed(1)].forEach((v) => row.appendChild(el("td", {}, String(v))));
      body.appendChild(row);
    });
    $("trail").hidden = false;
  }

  // A small line chart for a trend (BP, A1c, weight) beside the text.
  function renderChart(chart) {
    const box = $("chart");
    box.textContent = "";
    if (!chart || !chart.points || chart.points.length < 2) { box.hidden = true; return; }
    const W = 360, H = 120, P = 28, NS = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("width", W); svg.setAttribute("height", H); svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", chart.title);
    const values = chart.points.flatMap((p) => p.values);
    const lo = Math.min(...values), hi = Math.max(...values), span = hi - lo || 1;
    const x = (i) => P + (i * (W - 2 * P)) / (chart.points.length - 1);
    const y = (v) => H - P + 8 - ((v - lo) / span) * (H - 2 * P);
    const series = chart.points[0].values.length;
    for (let s = 0; s < series; s++) {
      const line = document.createElementNS(NS, "polyline");
      line.setAttribute("points", chart.points.map((p, i) => x(i) + "," + y(p.values[s])).join(" "));
      line.setAttribute("fill", "none"); line.setAttribute("stroke", s ? "#8aa4c8" : "#1f6feb"); line.setAttribute("stroke-width", "2");
      svg.appendChild(line);
      chart.points.forEach((p, i) => {
        const dot = document.createElementNS(NS, "circle");
        dot.setAttribute("cx", x(i)); dot.setAttribute("cy", y(p.values[s])); dot.setAttribute("r", "3");
        dot.setAttribute("fill", s ? "#8aa4c8" : "#1f6feb");
        const tip = document.createElementNS(NS, "title"); tip.textContent = p.date + ": " + p.values[s] + " " + (chart.unit || "");
        dot.appendChild(tip); svg.appendChild(dot);
      });
    }
    const label = document.createElementNS(NS, "text");
    label.setAttribute("x", P); label.setAttribute("y", 14); label.setAttribute("font-size", "11");
    label.textContent = chart.title + (chart.unit ? " (" + chart.unit + ")" : "") + "  " + chart.points[0].date + " → " + chart.points[chart.points.length - 1].date;
    svg.appendChild(label);
    box.appendChild(svg);
    box.hidden = false;
  }

  // --- side panel ----------------------------------------------------------------------------
  function openCitation(n) {
    if (!current) return;
    const citation = current.citations.find((c) => c.n === n);
    if (citation) openRecord(citation.ref);
  }

  function openRecord(ref) {
    api("/api/record?ref=" + encodeURIComponent(ref)).then(({ ok, body }) => {
      const panel = $("panel");
      panel.hidden = false;
      if (!ok) { $("panel-title").textContent = body.error || "Record unavailable"; return; }
      $("panel-title").textContent = body.readable.title;
      $("panel-ref").textContent = body.ref;
      const fields = $("panel-fields");
      fields.textContent = "";
      body.readable.fields.forEach(([k, v]) => { fields.appendChild(el("dt", {}, k)); fields.appendChild(el("dd", {}, v)); });
      $("panel-note").hidden = !body.readable.note_text;
      $("panel-note").textContent = body.readable.note_text || "";
      $("panel-raw").textContent = JSON.stringify(body.resource, null, 2);
      $("panel-raw").hidden = true;
      $("raw-toggle").textContent = "Show raw JSON";
    });
  }
  $("panel-close").addEventListener("click", () => { $("panel").hidden = true; });
  $("raw-toggle").addEventListener("click", () => {
    const raw = $("panel-raw");
    raw.hidden = !raw.hidden;
    $("raw-toggle").textContent = raw.hidden ? "Show raw JSON" : "Hide raw JSON";
  });

  // --- summary tab: the structured context bundle, every line opening its record -------------
  const summaryItem = {
    problems: (i) => i.name + (i.since ? " · since " + i.since : ""),
    medications: (i) => i.name + (i.dose ? " · " + i.dose : ""),
    allergies: (i) => i.name + (i.reactions.length ? " · " + i.reactions.join(", ") : "") + (i.criticality ? " · criticality " + i.criticality : ""),
    labs: (i) => i.name + ": " + i.value + " · " + i.date + (i.flag ? " · " + i.flag : ""),
    vitals: (i) => i.name + ": " + i.value + " · " + i.date,
    encounters: (i) => i.date + " · " + (i.type || i.class) + (i.reason ? " · " + i.reason : ""),
  };
  function loadSummary() {
    api("/api/context").then(({ ok, body }) => {
      const box = $("summary-body");
      box.textContent = "";
      if (!ok) { box.appendChild(el("div", { class: "muted small" }, body.error || "The summary could not be loaded.")); return; }
      Object.keys(summaryItem).forEach((key) => {
        const section = el("section", { class: "summary-section" });
        section.appendChild(el("h4", {}, key + " (" + body[key].length + ")"));
        if (!body[key].length) section.appendChild(el("div", { class: "muted small" }, "none recorded"));
        body[key].forEach((item) => {
          const row = el("button", { type: "button", class: "summary-item", "data-ref": item.ref }, summaryItem[key](item));
          row.addEventListener("click", () => openRecord(item.ref));
          section.appendChild(row);
        });
        box.appendChild(section);
      });
    });
  }
  $("summary").addEventListener("toggle", () => { if ($("summary").open) loadSummary(); });

  pollStatus();
})();
