// The frame: progress while the record indexes, questions, cited answers, chips and the side panel.
// Everything from the server is inserted as text, never as HTML.
(function () {
  "use strict";
  const meta = (name) => document.querySelector('meta[name="' + name + '"]').content;
  const handle = meta("chartcite-session"), patientId = meta("chartcite-patient"), framePath = meta("chartcite-frame");
  const $ = (id) => document.getElementById(id);

  // The frame's own address: a reload, back or restored tab comes back to this launch (never the
  // browser's latest one), and after a SMART callback the one-time code leaves the address bar.
  if (window.location.pathname !== framePath) window.history.replaceState(null, "", framePath);

  // The EHR's smart_style_url colours (checked server-side) become the frame's CSS variables.
  const styleNames = { color_highlight: "--accent", color_background: "--bg", color_error: "--warn",
                       dim_border_radius: "--radius" };
  document.querySelectorAll('meta[name="ehr-style"]').forEach((m) => {
    const variable = styleNames[m.dataset.name];
    if (variable) document.documentElement.style.setProperty(variable, m.content);
  });

  function api(path, options) {
    options = options || {};
    options.headers = Object.assign({ "X-Chartcite-Session": handle, "X-Chartcite-Patient": patientId },
                                    options.headers || {});
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
  let ready = false, pollTimer = null;
  function poll(ms) { clearTimeout(pollTimer); pollTimer = setTimeout(pollStatus, ms); }
  function syncLine(text, percent) {
    $("sync").hidden = false;
    $("sync-text").textContent = text;
    if (percent !== undefined) $("sync-bar").style.width = percent + "%";
  }
  // What the clinician is asking about while the record cannot be refreshed: the record as last
  // read from the EHR (the last sync that succeeded), its age counted from that moment.
  function indexedAge(body) {
    return body.indexed && body.synced_at ? " Answers come from the record as read from the EHR " +
      ageSince(body.synced_at) + "." : "";
  }
  function pollStatus() {
    api("/api/status").then(({ ok, status, body }) => {
      if (!ok) { if (status === 0 || status === 429 || status >= 500) poll(status === 429 ? 5000 : 2000); return; }
      fillBanner(body.banner || {});
      const job = body.job;
      const active = job && (job.state === "queued" || job.state === "running");
      const waiting = job && job.state === "waiting";
      ready = body.indexed && !active && !waiting;
      // Once the EHR sign-in has ended no retry can read the record: only a new launch can.
      const signedOut = job && job.state === "failed" && job.phase === "sign_in_expired";
      $("retry-sync").hidden = signedOut || !(waiting || (job && job.state === "failed"));
      // A finished sync may still have something to say ("2 notes could not be read from the EHR").
      const notice = job && job.state === "done" && job.message;
      $("sync").hidden = ready && !(job && job.state === "failed") && !notice;
      if (notice) syncLine(job.message, 100);
      if (waiting) {
        const seconds = Math.max(0, Math.round(job.retry_at - Date.now() / 1000));
        syncLine((job.message || "The EHR could not be reached") + "; retrying in " + seconds + " s." + indexedAge(body), 0);
      } else if (signedOut) {
        syncLine("The EHR sign-in has ended, so the record cannot be refreshed here: open chartcite from the EHR " +
                 "again." + indexedAge(body));
      } else if (job && job.state === "failed") {
        syncLine("The record could not be refreshed (" + (job.message || "error") + "). Retry, or open chartcite " +
                 "from the EHR again." + indexedAge(body));
      } else if (active) {
        // The one progress figure of the frame: an answer given meanwhile refers to it.
        let what = "Opening this patient's record…";
        if (job.phase === "fetching" && job.total) what = "Fetching the record from the EHR: " + job.done + " of " + job.total + " kinds of record";
        if (job.phase === "words") what = "Preparing this patient's record for questions…";
        if (job.phase === "embedding" && job.total) what = "Still reading: " + job.done + " of " + job.total + " passages searchable by meaning so far (problems, medications and allergies first)";
        syncLine(what + (body.indexed ? ". You can ask now; an answer may miss what is not read yet." : ""),
                 job.percent || 2);
      }
      $("ask-button").disabled = !body.indexed;
      $("ask-form").dataset.ready = ready ? "yes" : "no";
      $("ask-form").dataset.sync = job ? job.state : "none";
      if (!ready) poll(1000);
    }).catch(() => poll(2000));
  }

  // A first launch renders before the record is indexed: the banner fills in from the status.
  function fillBanner(b) {
    if (b.name) { $("banner-name").textContent = b.name; $("banner-name").classList.remove("muted"); }
    if (b.age !== null && b.age !== undefined) $("banner-age").textContent = b.age + " y";
    if (b.gender) $("banner-gender").textContent = b.gender;
    if (b.birth_date) $("banner-dob").textContent = "DOB " + b.birth_date;
  }

  function resync() {
    post("/api/sync", {}).then(({ ok, body }) => {
      if (!ok) { syncLine(body.error || "The refresh could not be started."); return; }
      ready = false; $("ask-form").dataset.ready = "no"; pollStatus();
    });
  }
  $("resync").addEventListener("click", resync);
  $("retry-sync").addEventListener("click", resync);

  $("end-session").addEventListener("click", () => {
    post("/api/session/end", {}).then(() => {
      document.querySelector(".frame").replaceChildren(
        el("p", { class: "error-message" }, "Session ended. Open chartcite from the EHR again to continue."));
    });
  });

  // Dates as a clinician writes them ("12 Mar 2024"); the API keeps ISO dates (unambiguous, and
  // what the record holds), the frame shows the clinical form with the ISO date on hover.
  const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
  const ISO_DATE = /\b(\d{4})-(\d{2})-(\d{2})\b/g;
  function clinicalDate(iso) {
    const m = /^(\d{4})-(\d{2})-(\d{2})/.exec(iso || "");
    return m ? Number(m[3]) + " " + MONTHS[Number(m[2]) - 1] + " " + m[1] : (iso || "");
  }
  function ageSince(seconds) {
    const elapsed = Math.max(0, Date.now() / 1000 - seconds), minutes = Math.round(elapsed / 60);
    if (minutes < 2) return "a minute ago";
    if (minutes < 60) return minutes + " minutes ago";
    const hours = Math.round(minutes / 60);
    if (hours < 36) return hours + " hour" + (hours === 1 ? "" : "s") + " ago";
    return relativeAge(new Date(seconds * 1000).toISOString().slice(0, 10));
  }
  function relativeAge(iso) {
    const then = new Date(iso + "T00:00:00"), days = Math.round((Date.now() - then) / 86400000);
    if (isNaN(days) || days < 0) return "";
    if (days < 1) return "today";
    if (days < 60) return days + " day" + (days === 1 ? "" : "s") + " ago";
    if (days < 730) return Math.round(days / 30.44) + " months ago";
    return Math.floor(days / 365.25) + " years ago";
  }
  function datedText(text, withAge) {
    let aged = false;      // the age follows the date's first mention only
    return text.replace(ISO_DATE, (iso) => {
      const age = withAge === iso && !aged ? " (" + relativeAge(iso) + ")" : "";
      aged = aged || Boolean(age);
      return clinicalDate(iso) + age;
    });
  }
  function newestDate(text) {
    const dates = text.match(ISO_DATE) || [];
    return dates.sort().pop() || null;
  }

  // A statement with its [n] marks, each opening the record it cites: inline where each clause
  // cites its own record, else after the sentence.
  function citedParagraph(text, citations, lead) {
    const p = el("p", { class: lead ? "statement lead" : "statement" });
    let age = lead ? newestDate(text) : null;
    const inline = /\[\d+\]/.test(text);
    const parts = inline ? text.split(/(\[\d+\])/) : [text + " "];
    parts.forEach((part) => {
      const mark = /^\[(\d+)\]$/.exec(part);
      if (mark) p.appendChild(citeMark(Number(mark[1])));
      else if (part) {
        p.appendChild(document.createTextNode(datedText(part, age)));
        if (age && part.includes(age)) age = null;
      }
    });
    if (!inline) citations.forEach((n) => p.appendChild(citeMark(n)));
    return p;
  }
  function citeMark(n) {
    const mark = el("a", { class: "cite", href: "#", "data-n": String(n) }, "[" + n + "]");
    mark.addEventListener("click", (e) => { e.preventDefault(); openCitation(n); });
    return mark;
  }

  // "Copy answer with citations": plain text for a note, with each source's date and kind.
  function copyText(result) {
    const lines = result.statements.map((s) => datedText(/\[\d+\]/.test(s.text) ? s.text : s.text + " " + s.citations.map((n) => "[" + n + "]").join(" ")));
    const sources = result.citations.map((c) => "[" + c.n + "] " + c.label.replace(ISO_DATE, clinicalDate) + " (" + c.ref + ")");
    return (result.lead ? result.lead + "\n" : "") + lines.join("\n") + (sources.length ? "\n\nSources (" + "chartcite, " + clinicalDate(new Date().toISOString().slice(0, 10)) + "):\n" + sources.join("\n") : "");
  }
  function offerCopy(result) {
    const button = el("button", { type: "button", id: "copy-answer", class: "link small" }, "Copy answer with citations");
    const box = el("textarea", { id: "copy-text", readonly: "readonly", rows: "4", hidden: "hidden" });
    box.value = copyText(result);
    button.addEventListener("click", () => {
      box.hidden = false; box.select();
      const done = () => { button.textContent = "Copied — paste it into the note"; };
      if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(box.value).then(done, () => { document.execCommand("copy"); done(); });
      else { document.execCommand("copy"); done(); }
    });
    return [button, box];
  }

  // --- summary drafts: shown for reading, saved only on "Save draft" -----------------------------
  let currentDraft = null;
  function renderDraft(draft) {
    closePanel();
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
          $("meta").textContent = ok ? "Draft saved." : (body.error || "Not saved.");
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
    closePanel();
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
    closePanel();
    const answer = $("answer");
    answer.textContent = "";
    // Asked while the record is still being read: said before the answer, not after, and without
    // a figure of its own (the progress line above is the one figure).
    if (result.reading) answer.appendChild(el("p", { class: "reading-note", role: "note" },
      "This record is still being read (see the progress above), so this answer may be incomplete. " +
      "Ask again when reading finishes."));
    if (result.banner) {
      answer.appendChild(el("p", { class: "banner-general" }, result.banner));
      answer.appendChild(el("p", { class: "statement general" }, result.answer));
    } else if (result.abstained) {
      // An abstention may list what the record holds of the asked class: the lead, then each entry cited.
      answer.appendChild(el("p", { class: "abstain" }, result.lead || result.answer));
    }
    // The answer sentence first; supporting sentences after it, beyond three behind "more".
    const supporting = [];
    result.statements.forEach((s) => {
      if (s.lead) answer.appendChild(citedParagraph(s.text, s.citations, true));
      else supporting.push(citedParagraph(s.text, s.citations, false));
    });
    supporting.slice(0, 3).forEach((p) => answer.appendChild(p));
    if (supporting.length > 3) {
      const more = el("details", { class: "more" });
      more.appendChild(el("summary", {}, (supporting.length - 3) + " more"));
      supporting.slice(3).forEach((p) => more.appendChild(p));
      answer.appendChild(more);
    }
    if (result.statements.length && !result.general) offerCopy(result).forEach((node) => answer.appendChild(node));
    const chips = $("chips");
    result.citations.forEach((c) => {
      const chip = el("button", { type: "button", class: "chip", "data-ref": c.ref });
      chip.appendChild(el("b", {}, String(c.n)));
      chip.appendChild(document.createTextNode(c.label.replace(ISO_DATE, clinicalDate)));
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

  // A chart a clinician can read: dates on the x axis, values with the unit on the y axis, each
  // point labelled (and hoverable), the reference range as a band, systolic and diastolic
  // together, and the same values as text for screen readers.
  const NS = "http://www.w3.org/2000/svg";
  function svgEl(tag, attrs, text) {
    const node = document.createElementNS(NS, tag);
    Object.entries(attrs || {}).forEach(([k, v]) => node.setAttribute(k, v));
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function niceTicks(lo, hi, count) {
    const step0 = (hi - lo) / count, mag = Math.pow(10, Math.floor(Math.log10(step0 || 1)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((st) => st >= step0) || step0;
    const ticks = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-9; v += step) ticks.push(Number(v.toFixed(6)));
    return ticks;
  }
  function renderChart(chart) {
    const box = $("chart");
    box.textContent = "";
    if (!chart || !chart.points || chart.points.length < 2) { box.hidden = true; return; }
    const W = 460, H = 210, L = 52, R = 18, T = 14, B = 40;
    const pts = chart.points, names = chart.series || [chart.title];
    const times = pts.map((p) => Date.parse(p.date + "T00:00:00Z"));
    const t0 = Math.min(...times), t1 = Math.max(...times);
    const x = (i) => L + (t1 > t0 ? (times[i] - t0) / (t1 - t0) : i / (pts.length - 1)) * (W - L - R);
    const values = pts.flatMap((p) => p.values);
    const band = chart.range || null;
    const bounds = values.concat(band ? [band.low, band.high].filter((v) => v !== null && v !== undefined) : []);
    let lo = Math.min(...bounds), hi = Math.max(...bounds);
    const pad = (hi - lo) * 0.12 || Math.abs(hi) * 0.1 || 1; lo -= pad; hi += pad;
    const y = (v) => T + (1 - (v - lo) / (hi - lo)) * (H - T - B);
    const svg = svgEl("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img", "aria-labelledby": "chart-title chart-desc" });
    if (band) {
      const top = y(band.high !== null && band.high !== undefined ? band.high : hi), bottom = y(band.low !== null && band.low !== undefined ? band.low : lo);
      svg.appendChild(svgEl("rect", { class: "range-band", x: L, y: top, width: W - L - R, height: Math.max(0, bottom - top) }));
      svg.appendChild(svgEl("text", { class: "range-label", x: W - R - 4, y: top + 11, "text-anchor": "end" }, "reference range"));
    }
    niceTicks(lo, hi, 4).forEach((v) => {
      svg.appendChild(svgEl("line", { class: "grid", x1: L, x2: W - R, y1: y(v), y2: y(v) }));
      svg.appendChild(svgEl("text", { class: "tick", x: L - 6, y: y(v) + 4, "text-anchor": "end" }, String(v)));
    });
    svg.appendChild(svgEl("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }));
    svg.appendChild(svgEl("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
    svg.appendChild(svgEl("text", { class: "axis-title", x: 12, y: (T + H - B) / 2, transform: "rotate(-90 12 " + (T + H - B) / 2 + ")", "text-anchor": "middle" }, chart.unit || chart.title));
    const labelled = pts.length <= 6 ? pts.map((_, i) => i) : [0, Math.floor((pts.length - 1) / 2), pts.length - 1];
    labelled.forEach((i) => {
      svg.appendChild(svgEl("text", { class: "tick", x: x(i), y: H - B + 16, "text-anchor": i === 0 ? "start" : i === pts.length - 1 ? "end" : "middle" }, clinicalDate(pts[i].date)));
    });
    const colours = ["#1f6feb", "#b35900"];
    names.forEach((name, s) => {
      svg.appendChild(svgEl("polyline", { points: pts.map((p, i) => x(i) + "," + y(p.values[s])).join(" "), fill: "none", stroke: colours[s], "stroke-width": 2 }));
      pts.forEach((p, i) => {
        const dot = svgEl("circle", { cx: x(i), cy: y(p.values[s]), r: 3.5, fill: colours[s], "data-date": p.date });
        dot.appendChild(svgEl("title", {}, clinicalDate(p.date) + ": " + name + " " + p.values[s] + " " + (chart.unit || "")));
        svg.appendChild(dot);
        if (pts.length <= 8) svg.appendChild(svgEl("text", { class: "point-label", x: x(i) + (i === 0 ? 4 : i === pts.length - 1 ? -4 : 0), y: y(p.values[s]) + (s ? 15 : -7),
          "text-anchor": i === 0 ? "start" : i === pts.length - 1 ? "end" : "middle" }, String(p.values[s])));
      });
      if (names.length > 1) {
        svg.appendChild(svgEl("rect", { x: L + 8 + s * 90, y: H - 14, width: 10, height: 3, fill: colours[s] }));
        svg.appendChild(svgEl("text", { class: "tick", x: L + 22 + s * 90, y: H - 10 }, name));
      }
    });
    const figure = el("figure", { class: "chart-figure" });
    figure.appendChild(svg);
    const caption = el("figcaption", { id: "chart-title" }, chart.title + (chart.unit ? " (" + chart.unit + ")" : "") + ", "
      + clinicalDate(pts[0].date) + " – " + clinicalDate(pts[pts.length - 1].date) + ", " + pts.length + " results");
    if (chart.full_title && chart.full_title !== chart.title) caption.appendChild(el("span", { class: "muted small full-title" }, " · " + chart.full_title));
    figure.appendChild(caption);
    figure.appendChild(el("p", { id: "chart-desc", class: "sr-only" }, pts.map((p) => clinicalDate(p.date) + ": "
      + (names.length > 1 ? names.map((n, s) => n + " " + p.values[s]).join(", ") : p.values[0]) + " " + (chart.unit || "")).join("; ")
      + (band ? "; reference range " + (band.low ?? "") + "–" + (band.high ?? "") : "")));
    box.appendChild(figure);
    box.hidden = false;
  }

  // --- side panel ----------------------------------------------------------------------------
  function openCitation(n) {
    if (!current) return;
    const citation = current.citations.find((c) => c.n === n);
    if (citation) openRecord(citation.ref, citation.quotes || []);
  }

  // The panel belongs to the answer it was opened from: a new answer or draft closes it, and a
  // record that arrives after that is not shown.
  let panelRequest = 0;
  function closePanel() {
    panelRequest += 1;
    $("panel").hidden = true;
    $("panel-title").textContent = ""; $("panel-ref").textContent = ""; $("panel-fields").textContent = "";
    $("panel-note").textContent = ""; $("panel-note").hidden = true;
    $("panel-raw").textContent = ""; $("panel-raw").hidden = true;
  }

  // The note's sentences the answer quotes, marked where they stand in the note's own text
  // (matched word by word: the note keeps its line breaks), the first scrolled into view.
  function showNote(box, text, quotes) {
    box.textContent = "";
    const escape = (w) => w.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
    // A quoted list reads "intro: item; item" where the note has "intro:\n- item\n- item": between
    // two words, spaces, list marks and the semicolons that joined the items all match.
    const found = quotes.map((q) => new RegExp(q.split(/[\s;]+/).filter(Boolean).map(escape).join("[\\s;\u2022*-]+")).exec(text))
      .filter(Boolean).sort((a, b) => a.index - b.index);
    let at = 0;
    found.forEach((m) => {
      if (m.index < at) return;
      box.appendChild(document.createTextNode(text.slice(at, m.index)));
      box.appendChild(el("mark", { class: "quoted" }, m[0]));
      at = m.index + m[0].length;
    });
    box.appendChild(document.createTextNode(text.slice(at)));
    const first = box.querySelector("mark.quoted");
    if (first) first.scrollIntoView({ block: "center" });
  }

  function openRecord(ref, quotes) {
    const request = ++panelRequest;
    api("/api/record?ref=" + encodeURIComponent(ref)).then(({ ok, body }) => {
      if (request !== panelRequest) return;
      const panel = $("panel");
      panel.hidden = false;
      if (!ok) { $("panel-title").textContent = body.error || "Record unavailable"; return; }
      $("panel-title").textContent = body.readable.title;
      $("panel-ref").textContent = body.ref;
      const fields = $("panel-fields");
      fields.textContent = "";
      body.readable.fields.forEach(([k, v]) => { fields.appendChild(el("dt", {}, k)); fields.appendChild(el("dd", {}, datedText(v))); });
      $("panel-note").hidden = !body.readable.note_text;
      showNote($("panel-note"), body.readable.note_text || "", quotes || []);
      $("panel-raw").textContent = JSON.stringify(body.resource, null, 2);
      $("panel-raw").hidden = true;
      $("raw-toggle").textContent = "Show raw JSON";
    });
  }
  $("panel-close").addEventListener("click", closePanel);
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
    api("/api/context?similar=no").then(({ ok, body }) => {
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

  // The Patient message panel (reply.js) opens cited sentences in the same side panel.
  window.chartciteFrame = { get: api, post: post, openRecord: openRecord, patientId: patientId };

  // --- similar patients and cohorts (only where the deployment turned them on) -------------
  // What the server sends is already de-identified: age bands, sex, what is shared, offsets.
  function similarItem(peer) {
    const item = el("li", { class: "similar-item" });
    item.appendChild(el("div", { class: "similar-head" },
      "similarity " + peer.similarity.toFixed(2) + " · " + peer.sex + " · aged " + peer.age_band));
    const parts = [["Shares", peer.shared], ["What followed for them", peer.followed]];
    parts.forEach(([title, lines]) => {
      if (!lines.length) return;
      item.appendChild(el("div", { class: "muted small" }, title));
      const list = el("ul", { class: "similar-lines" });
      lines.forEach((line) => list.appendChild(el("li", {}, line)));
      item.appendChild(list);
    });
    return item;
  }
  function loadSimilar() {
    $("similar-message").textContent = "Comparing with this workspace's patients…";
    post("/api/similar", { k: 5 }).then(({ ok, body }) => {
      const list = $("similar-list");
      list.textContent = "";
      if (!ok) { $("similar-message").textContent = body.error || "Similar patients could not be loaded."; return; }
      $("similar-source").textContent = body.source;
      $("similar-message").textContent = body.message + " Confidence: " + body.confidence + ".";
      body.similar.forEach((peer) => list.appendChild(similarItem(peer)));
    });
  }
  function cohortLine(group, outcome, unit) {
    if (group.median_change === null) {
      return group.exposure + ": " + (group.patients ? group.patients + " patients; " : "") + group.note;
    }
    const change = (group.median_change > 0 ? "+" : "") + group.median_change;
    return group.exposure + ": " + group.patients + " patients, " + group.with_measure +
      " with " + outcome + " before and after; median change " + change + (unit ? " " + unit : "");
  }
  function compareCohort(event) {
    event.preventDefault();
    const box = $("cohort-result");
    const payload = { condition: $("cohort-condition").value.trim(), outcome: $("cohort-outcome").value.trim(),
                      exposures: $("cohort-exposures").value.split(",").map((w) => w.trim()).filter(Boolean),
                      window_months: parseInt($("cohort-window").value, 10) || 12 };
    box.textContent = "Comparing…";
    post("/api/cohort", payload).then(({ ok, body }) => {
      box.textContent = "";
      if (!ok) { box.appendChild(el("div", { class: "error-message" }, body.error || "The comparison failed.")); return; }
      box.appendChild(el("div", {}, body.outcome + " within " + body.window_months +
        " months after each exposure started, patients with " + body.condition + ":"));
      const list = el("ul", { class: "cohort-groups" });
      body.groups.forEach((group) => list.appendChild(el("li", {}, cohortLine(group, body.outcome, body.unit))));
      box.appendChild(list);
      if (body.left_out) box.appendChild(el("div", { class: "muted" }, body.left_out));
      box.appendChild(el("div", { class: "cohort-statement" }, body.statement));
    });
  }
  if ($("similar")) {
    $("similar").addEventListener("toggle", () => { if ($("similar").open) loadSimilar(); });
    $("cohort-form").addEventListener("submit", compareCohort);
  }

  pollStatus();
})();
