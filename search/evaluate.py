"""Retrieval evaluation over questions with gold evidence groups (see shared/data/questions/README.md).

A group is hit when any of its member refs is among the resources the top-k evidence draws on.
Besides recall@k and MRR it reports, like the published ablations, the filter stage's corpus
ratio and filtering recall (gold groups still reachable after filtering), abstention accuracy on
unanswerable questions, false abstentions on answerable ones, latency, and how many of the
question's facts (a drug, a value as stored, a date) the answer text states.
"""
from __future__ import annotations

import json
import re
import statistics
import time
from collections import defaultdict
from datetime import date

from search.answering.invariants import citations_outside_evidence
from search.backends.base import Scope


def load_questions(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def refs_at(result: dict, k: int) -> set[str]:
    refs = set()
    for ev in result["evidence"][:k]:
        refs.update(ev.get("refs") or [ev["ref"]])
    return refs


def recall_at(result: dict, gold: list[list[str]], k: int) -> float:
    if not gold:
        return 0.0
    found = refs_at(result, k)
    return sum(1 for group in gold if found & set(group)) / len(gold)


def facts_stated(result: dict, facts: list[str]) -> float:
    """The share of the expected facts that the answer text contains, case-insensitively."""
    if not facts:
        return 1.0
    text = result["answer"].lower()
    return sum(1 for fact in facts if fact.lower() in text) / len(facts)


MARK = re.compile(r"\s*\[\d+\]")
WORD = re.compile(r"[A-Za-z0-9][\w.%/+'-]*")
# A sentence ends at . ! or ? (its citation marks go with it) before a space and a capital, a
# digit, a quote or a dash; "6.31" and "mg/dL." inside a line do not end one.
SENTENCE_END = re.compile(r"(?<=[.!?])((?:\s*\[\d+\])*)\s+(?=[A-Z0-9\"“(—-])")
QUOTED = re.compile(r"\"[^\"]*\"|“[^”]*”")


def answer_words(text: str) -> int:
    """Words a clinician reads: the citation marks are not words."""
    return len(WORD.findall(MARK.sub("", text)))


def sentences(text: str) -> list[str]:
    """The answer's sentences with their marks; a quoted passage stays inside its sentence."""
    shielded = QUOTED.sub(lambda m: m.group(0).replace(".", "\x00").replace("!", "\x01").replace("?", "\x02"), text)
    parts, start = [], 0
    for m in SENTENCE_END.finditer(shielded):
        parts.append(shielded[start:m.end(1)])
        start = m.end()
    parts.append(shielded[start:])
    restore = str.maketrans({"\x00": ".", "\x01": "!", "\x02": "?"})
    return [p.translate(restore).strip() for p in parts if p.strip()]


def clauses(text: str) -> list[str]:
    """Sentences split at semicolons outside quotes: each is a claim that needs its own [n]."""
    out = []
    for sentence in sentences(text):
        shielded = QUOTED.sub(lambda m: m.group(0).replace(";", "\x00"), sentence)
        out += [c.replace("\x00", ";").strip() for c in shielded.split(";") if c.strip()]
    return out


# A part of a question the record cannot answer says so ("I don't have evidence for that in this
# patient's record for “…”"): it claims nothing and cites nothing, as a whole abstention does.
ABSTAINED_PART = re.compile(r"^I don't have evidence for that\b")


def uncited_clauses(result: dict) -> int:
    """Clauses of an answer that carry no [n]: a statement the clinician cannot open. An
    abstention, whole or of one part, cites nothing by design and counts none."""
    if result["abstained"]:
        return 0
    return sum(1 for clause in clauses(result["answer"])
               if not MARK.search(clause) and WORD.search(clause) and not ABSTAINED_PART.match(clause))


def first_sentence_facts(result: dict, facts: list[str]) -> float:
    """The share of the expected facts the answer's first sentence states."""
    if not facts:
        return 1.0
    first = (sentences(result["answer"]) or [""])[0].lower()
    return sum(1 for fact in facts if fact.lower() in first) / len(facts)


def answer_figures(result: dict, facts: list[str]) -> dict:
    """How the answer reads: facts stated, facts in its first sentence, words, uncited clauses."""
    return {"facts": facts_stated(result, facts), "first_facts": first_sentence_facts(result, facts),
            "words": answer_words(result["answer"]), "uncited": uncited_clauses(result)}


def class_present_no_evidence(result: dict) -> bool:
    """A bare "no evidence" although the record holds entries of the asked class (an allergy
    question for a patient with allergies): the patient-safety failure the answer must never show."""
    asked = result.get("diagnostics", {}).get("asked_class") or {}
    return bool(result["abstained"] and asked.get("records") and not result["citations"])


def first_sentence_refs(result: dict) -> set[str]:
    """The records the answer's first sentence cites."""
    first = (sentences(result["answer"]) or [""])[0]
    numbers = {int(n) for n in re.findall(r"\[(\d+)\]", first)}
    return {c["ref"] for c in result.get("citations", []) if c.get("n") in numbers}


def question_today(q: dict):
    """The day a question's relative window counts from: the set's `today` ("since last month"
    means the same month on every run), else the clock's."""
    return date.fromisoformat(q["today"]) if q.get("today") else None


def count_stated(result: dict, q: dict) -> float | None:
    """For a question with a gold `count`: 1.0 when the answer's first sentence states that number
    (as digits) and no other count of the target, else 0.0; None for other questions."""
    if q.get("count") is None:
        return None
    first = MARK.sub("", (sentences(result["answer"]) or [""])[0])
    first = re.sub(r"\b\d{4}-\d{2}-\d{2}\b", " ", first)       # dates are not counts
    stated = re.findall(r"(?<![\d.])(\d+)(?![\d.])", first)
    if q["count"] == 0:
        return 1.0 if re.match(r"\s*No\b", first) else 0.0
    return 1.0 if stated and int(stated[0]) == q["count"] else 0.0


VISIT_KINDS = ("visit", "duration")


def visit_facts(result: dict, q: dict) -> float | None:
    """For a visit question (its kind `visit` or `duration`): the facts stated (class, dates, length,
    place, reason), else None."""
    if q.get("kind") not in VISIT_KINDS:
        return None
    return facts_stated(result, q.get("facts") or [])


def wrong_yes(result: dict, q: dict) -> bool:
    """A "Yes —" whose listed entries are not what was asked: the record cannot answer the
    question, or the first sentence cites none of the gold records."""
    if not result["answer"].startswith("Yes"):
        return False
    if not q["answerable"]:
        return True
    gold = {ref for group in q["gold"] for ref in group}
    return bool(gold) and not (first_sentence_refs(result) & gold)


# What an answer says the record lacks: a complete class list that matches nothing, a class none
# of whose entries belongs, an allergy with none related.
NEGATIVE_CLAIM = re.compile(r"none of which matches|\bNo [\w ,'/-]+ is recorded among\b|\bNo allergy to\b", re.I)


def hidden_match(result: dict, q: dict) -> bool:
    """The record holds what was asked (the question is answerable) and the answer says it does
    not: it claims the record lacks it ("none of which matches", "No anticoagulant is recorded
    among…"), or it abstains while citing the very record that answers (listed as context or as a
    non-matching entry). A plain abstention that shows nothing is a false abstention instead."""
    if not q["answerable"]:
        return False
    gold = {ref for group in q["gold"] for ref in group}
    shown = {c["ref"] for c in result.get("citations", [])}
    return bool(NEGATIVE_CLAIM.search(result["answer"]) or (result["abstained"] and shown & gold))


def _norm(text: str) -> str:
    return " ".join((text or "").split()).lower()


def cited_texts(result: dict) -> str:
    """The texts of the evidence the answer's statements cite (a citation is its evidence item of
    the same record whose text begins with the citation's snippet), joined."""
    numbers = {n for s in result.get("statements", []) for n in s.get("citations", [])}
    texts = []
    for c in result.get("citations", []):
        if c.get("n") not in numbers:
            continue
        snippet = _norm(c.get("snippet", ""))[:150]
        items = [e for e in result.get("evidence", []) if e["ref"] == c["ref"]]
        texts += [e.get("text", "") for e in items if _norm(e.get("text", "")).startswith(snippet)] or \
            [e.get("text", "") for e in items]
    return _norm(" ".join(texts))


def sentence_cited(result: dict, q: dict) -> float | None:
    """1 when every answering sentence of the question (`sentence`: a string, or a list of required
    items, an inner list holding alternatives) is in the evidence the answer cites; None for a
    question without one. An abstention cites no answer."""
    wanted = q.get("sentence")
    if not wanted or not q["answerable"]:
        return None
    if result["abstained"]:
        return 0.0
    text = cited_texts(result)
    items = wanted if isinstance(wanted, list) else [wanted]
    return float(all(any(_norm(s) in text for s in (item if isinstance(item, list) else [item])) for item in items))


EMPTY_CLASS = re.compile(r"\bNo (?:allergies|problems|medications|procedures)\b[^.]* recorded in this patient's record")


def reciprocal_rank(result: dict, gold: list[list[str]]) -> float:
    wanted = {ref for group in gold for ref in group}
    for ev in result["evidence"]:
        if wanted & set(ev.get("refs") or [ev["ref"]]):
            return 1.0 / ev["rank"]
    return 0.0


def filter_figures(service, tenant: str, q: dict, result: dict) -> tuple[float, float]:
    """(corpus ratio, filtering recall) after the filter stage."""
    stages = {s["name"]: s for s in result["diagnostics"]["stages"]}
    # A question answered as general medicine carries no retrieval of the record to measure.
    if "filter" not in stages or not result["diagnostics"].get("corpus_size"):
        return 1.0, 1.0
    ratio = stages["filter"]["corpus_ratio"]
    f = result["diagnostics"]["filter"]
    scope = Scope(tenant, q["patient_id"], tuple(f["semantic_types"]), f["date_from"], f["date_to"])
    reachable = service.backend.refs_in_scope(scope, [ref for group in q["gold"] for ref in group])
    recall = sum(1 for group in q["gold"] if reachable & set(group)) / len(q["gold"]) if q["gold"] else 1.0
    return ratio, recall


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def variants(pipelines: list[str], ablate: list[str]) -> list[tuple[str, str, tuple[str, ...]]]:
    """(label, pipeline, ablated stages): the pipelines asked for, then full without each stage."""
    out = [(p, p, ()) for p in pipelines]
    out += [(f"full -{stage}", "full", (stage,)) for stage in ablate]
    return out


def evaluate(service, tenant: str, questions_path: str, ks: list[int], pipelines: list[str],
             ablate: list[str] | None = None) -> dict:
    questions = load_questions(questions_path)
    depth = max(ks)
    report = {"questions": len(questions), "pipelines": {}}
    for label, pipeline, ablated in variants(pipelines, ablate or []):
        rows, latencies = [], []
        for q in questions:
            t0 = time.perf_counter()
            result = service.ask(tenant, q["patient_id"], q["question"], k=depth, pipeline=pipeline,
                                 question_id=q["id"], ablate=ablated, today=question_today(q))
            latencies.append((time.perf_counter() - t0) * 1000)
            ratio, filter_recall = filter_figures(service, tenant, q, result)
            rows.append({"id": q["id"], "kind": q["kind"], "answerable": q["answerable"], "gold": bool(q["gold"]),
                         "recall": {k: recall_at(result, q["gold"], k) for k in ks},
                         "rr": reciprocal_rank(result, q["gold"]) if q["answerable"] else 0.0,
                         "abstained": result["abstained"], "corpus_ratio": ratio, "filter_recall": filter_recall,
                         **answer_figures(result, q.get("facts") or []),
                         "class_no_evidence": class_present_no_evidence(result),
                         "wrong_yes": wrong_yes(result, q), "hidden_match": hidden_match(result, q),
                         "cited_outside": len(citations_outside_evidence(result)),
                         "sentence_cited": sentence_cited(result, q),
                         "empty_class": bool(q["answerable"] and EMPTY_CLASS.search(result["answer"])),
                         "conflict": any(st.get("conflict") for st in result.get("statements", [])),
                         "count_right": count_stated(result, q), "visit_facts": visit_facts(result, q)})
        report["pipelines"][label] = summarise(rows, ks, latencies)
    return report


def recall_after_stages(service, tenant: str, questions_path: str, k: int, pipeline: str = "full") -> dict[str, float]:
    """Recall@k of the ranking after each stage of a pipeline (over the answerable questions):
    where a gold record enters the candidates, and which stage lifts it into the top k."""
    from search.retrieval.pipeline import retrieve

    totals: dict[str, list[float]] = defaultdict(list)
    for q in (q for q in load_questions(questions_path) if q["answerable"] and q["gold"]):
        retrieval = retrieve(service.backend, service.embedder, q["question"], tenant, q["patient_id"], k=k,
                             pipeline=pipeline, reranker=service.reranker)
        for stage, ranked in retrieval.ranked_after.items():
            found = {ref for refs in ranked[:k] for ref in refs}
            totals[stage].append(sum(1 for group in q["gold"] if found & set(group)) / len(q["gold"]))
    return {stage: round(statistics.fmean(values), 4) for stage, values in totals.items()}


def summarise(rows: list[dict], ks: list[int], latencies: list[float]) -> dict:
    answerable = [r for r in rows if r["answerable"]]
    unanswerable = [r for r in rows if not r["answerable"]]
    # Recall is over the questions with gold evidence: "how many ED visits this year" answered
    # 0 has none to find (ops-dev), and every answerable question of the shared sets has some.
    retrievable = [r for r in answerable if r.get("gold", True)]
    by_kind = defaultdict(list)
    for r in retrievable:
        by_kind[r["kind"]].append(r)
    mean = lambda xs: round(statistics.fmean(xs), 4) if xs else 0.0
    return {
        "recall": {str(k): mean([r["recall"][k] for r in retrievable]) for k in ks},
        "mrr": mean([r["rr"] for r in retrievable]),
        "corpus_ratio": mean([r.get("corpus_ratio", 1.0) for r in answerable]),
        "filter_recall": mean([r.get("filter_recall", 1.0) for r in answerable]),
        "facts": mean([r["facts"] for r in answerable]),
        "multi_part_facts": mean([r["facts"] for r in answerable if r["kind"] == "multi"]),
        "first_facts": mean([r["first_facts"] for r in answerable]),
        "words_p50": percentile([r["words"] for r in answerable], 0.5),
        "words_p90": percentile([r["words"] for r in answerable], 0.9),
        "uncited_clauses": sum(r["uncited"] for r in rows),
        "abstention_accuracy": mean([1.0 if r["abstained"] else 0.0 for r in unanswerable]),
        "false_abstention": mean([1.0 if r["abstained"] else 0.0 for r in answerable]),
        "class_present_no_evidence": sum(1 for r in rows if r.get("class_no_evidence")),
        "wrong_yes": sum(1 for r in rows if r.get("wrong_yes")),
        "hidden_match": sum(1 for r in rows if r.get("hidden_match")),
        "citations_outside_evidence": sum(r.get("cited_outside", 0) for r in rows),
        "sentence_cited": mean([r["sentence_cited"] for r in answerable if r.get("sentence_cited") is not None]),
        "empty_class_answerable": sum(1 for r in rows if r.get("empty_class")),
        "conflicts": sum(1 for r in rows if r.get("conflict")),
        "answers_by_kind": answers_by_kind(rows),
        "counts_right": mean([r["count_right"] for r in rows if r.get("count_right") is not None]),
        "counts_asked": sum(1 for r in rows if r.get("count_right") is not None),
        "visit_facts": mean([r["visit_facts"] for r in rows if r.get("visit_facts") is not None]),
        "visit_questions": sum(1 for r in rows if r.get("visit_facts") is not None),
        "counts_wrong_ids": [r["id"] for r in rows if r.get("count_right") == 0.0],
        "p50_ms": round(percentile(latencies, 0.5), 1),
        "p95_ms": round(percentile(latencies, 0.95), 1),
        "by_kind": {kind: {str(k): mean([r["recall"][k] for r in items]) for k in ks} for kind, items in sorted(by_kind.items())},
        "misses_at_5": [r["id"] for r in retrievable if r["recall"].get(5, 1.0) < 1.0],
        "facts_missed": [r["id"] for r in answerable if r["facts"] < 1.0],
        "wrong_abstentions": [r["id"] for r in rows if r["abstained"] != (not r["answerable"])],
        "wrong_yes_ids": [r["id"] for r in rows if r.get("wrong_yes")],
        "hidden_match_ids": [r["id"] for r in rows if r.get("hidden_match")],
        "cited_outside_ids": [r["id"] for r in rows if r.get("cited_outside")],
    }


def answers_by_kind(rows: list[dict]) -> dict:
    """Per question kind: facts stated, the answering sentence cited (where the set has one), false
    abstentions (answerable) and abstentions (unanswerable)."""
    kinds = defaultdict(list)
    for r in rows:
        kinds[r["kind"]].append(r)
    mean = lambda xs: round(statistics.fmean(xs), 4) if xs else None
    return {kind: {"n": len(items),
                   "facts": mean([r["facts"] for r in items if r["answerable"]]),
                   "sentence_cited": mean([r["sentence_cited"] for r in items if r.get("sentence_cited") is not None]),
                   "false_abstentions": sum(1 for r in items if r["answerable"] and r["abstained"]),
                   "abstained": sum(1 for r in items if not r["answerable"] and r["abstained"])}
            for kind, items in sorted(kinds.items())}


def format_answers_by_kind(report: dict) -> list[str]:
    """The sentence-level table, for a set whose questions name their answering sentence."""
    lines = []
    for name, p in report["pipelines"].items():
        kinds = p.get("answers_by_kind") or {}
        if not any(v.get("sentence_cited") is not None for v in kinds.values()):
            continue
        lines += ["", f"answers by question kind ({name}): sentence-cited {p['sentence_cited']:.3f}, "
                      f"empty-class answers to answerable questions {p['empty_class_answerable']}, "
                      f"conflicts stated {p['conflicts']}",
                  f"{'kind':16} {'n':>4} {'facts':>6} {'sent-cited':>10} {'false-abst':>10} {'abstained':>9}"]
        for kind, v in kinds.items():
            show = lambda x: f"{x:.3f}" if x is not None else "-"
            lines.append(f"{kind:16} {v['n']:>4} {show(v['facts']):>6} {show(v['sentence_cited']):>10} "
                         f"{v['false_abstentions']:>10} {v['abstained']:>9}")
    return lines


def format_table(report: dict, ks: list[int]) -> str:
    lines = [f"questions: {report['questions']}", ""]
    head = (f"{'pipeline':16} {'corpus':>7} {'filt-R':>7} " + " ".join(f"{'R@' + str(k):>6}" for k in ks)
            + f" {'MRR':>6} {'facts':>6} {'1st-s':>6} {'words':>5} {'w-p90':>5} {'uncit':>5} {'abstain':>8} {'false-abst':>10} {'class-NE':>8} {'wrongY':>6} {'hidden':>6} {'cit-out':>7} {'multi':>6} {'p50 ms':>8} {'p95 ms':>8}")
    lines.append(head)
    for name, p in report["pipelines"].items():
        lines.append(f"{name:16} {p.get('corpus_ratio', 1.0):>7.3f} {p.get('filter_recall', 1.0):>7.3f} "
                     + " ".join(f"{p['recall'][str(k)]:>6.3f}" for k in ks)
                     + f" {p['mrr']:>6.3f} {p.get('facts', 0):>6.3f} {p.get('first_facts', 0):>6.3f} {p.get('words_p50', 0):>5.0f}"
                     + f" {p.get('words_p90', 0):>5.0f} {p.get('uncited_clauses', 0):>5} {p['abstention_accuracy']:>8.2f} {p['false_abstention']:>10.2f}"
                     + f" {p.get('class_present_no_evidence', 0):>8} {p.get('wrong_yes', 0):>6} {p.get('hidden_match', 0):>6} {p.get('citations_outside_evidence', 0):>7}"
                     + f" {p.get('multi_part_facts', 0):>6.3f}"
                     + f" {p['p50_ms']:>8.1f} {p['p95_ms']:>8.1f}")
    names = list(report["pipelines"])
    if "dense" in report["pipelines"] and "full" in report["pipelines"]:
        k = "5" if 5 in ks else str(ks[0])
        base, full = report["pipelines"]["dense"]["recall"][k], report["pipelines"]["full"]["recall"][k]
        if base:
            lines.append(f"\nfull vs dense: recall@{k} {full:.3f} vs {base:.3f} ({100 * (full - base) / base:+.1f}% relative)")
    kinds = sorted({kind for p in report["pipelines"].values() for kind in p["by_kind"]})
    k = 5 if 5 in ks else ks[0]
    lines += ["", f"recall@{k} by question kind", f"{'kind':12} " + " ".join(f"{n:>16}" for n in names)]
    for kind in kinds:
        lines.append(f"{kind:12} " + " ".join(f"{p['by_kind'].get(kind, {}).get(str(k), 0):>16.3f}"
                                              for p in report["pipelines"].values()))
    return "\n".join(lines + format_answers_by_kind(report) + format_operations(report))


def format_operations(report: dict) -> list[str]:
    """Counts stated right and visit facts, for a set whose questions carry a gold `count` or ask
    about visits (eval/ops-dev.jsonl)."""
    lines = []
    for name, p in report["pipelines"].items():
        if p.get("counts_asked") or p.get("visit_questions"):
            lines.append(f"{name}: counts stated right {p['counts_right']:.3f} ({p['counts_asked']} counts), "
                         f"visit facts {p['visit_facts']:.3f} ({p['visit_questions']} visit questions)")
    return ["", "operations"] + lines if lines else []
