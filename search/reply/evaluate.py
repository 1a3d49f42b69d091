"""`chartcite eval --mode reply`: reply drafts measured like the shared task (ArchEHR-QA).

Per message: the evidence sentences the draft cites against the gold sentences (a gold item is a
list of alternatives; an evidence sentence meets an alternative when either contains the other,
compared as lower-case words), the facts the draft states, its words, its uncited sentences, and
whether a message the record cannot answer was answered anyway.

With a language model configured (`CHARTCITE_LLM_URL`), the drafts are the model's, as the panel
would show them: each of its sentences verified against the evidence it cites; the report counts
the drafts the model wrote, its sentences kept and those removed by verification.

Question sets read: a notes-dev `questions.jsonl` (its `patient_portal` questions, each a message;
gold from `sentence`) and reply sets (`message`, `answerable`, `gold`, `facts`, `urgent`), such as
`search/reply/data/messages-dev.jsonl`.
"""
from __future__ import annotations

import json
import re
import statistics
from collections import Counter
from pathlib import Path

from .compose import build_reply


def load_messages(path: str | Path) -> list[dict]:
    rows = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        if "message" in item:
            rows.append(item)
        elif item.get("kind") == "patient_portal":
            sentence = item.get("sentence")
            gold = [[sentence]] if isinstance(sentence, str) else [i if isinstance(i, list) else [i] for i in sentence or []]
            rows.append({"id": item["id"], "patient_id": item["patient_id"], "message": item["question"],
                         "answerable": item.get("answerable", True), "gold": gold, "facts": item.get("facts", []),
                         "urgent": False})
    return rows


def _words(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def meets(sentence: str, alternative: str) -> bool:
    a, b = _words(sentence), _words(alternative)
    return bool(a and b) and (a in b or b in a)


def score_message(item: dict, reply: dict) -> dict:
    cited = {n for s in reply["sentences"] if s.get("kind") == "answer" for n in s["citations"]}
    chosen = [e["text"] for e in reply["evidence"] if e["n"] in cited]
    gold = item.get("gold") or []
    hits = sum(1 for text in chosen if any(meets(text, alt) for group in gold for alt in group))
    met = sum(1 for group in gold if any(meets(text, alt) for text in chosen for alt in group))
    draft = reply["draft"].lower()
    answer_sentences = [s for s in reply["sentences"] if s.get("kind") == "answer"]
    return {"id": item["id"], "answerable": item.get("answerable", True), "chosen": len(chosen), "hits": hits,
            "gold": len(gold), "met": met,
            "facts": all(f.lower() in draft for f in item.get("facts", [])) if item.get("facts") else None,
            "words": len(re.sub(r"\[\d+\]", "", reply["draft"]).split()),
            "uncited": sum(1 for s in answer_sentences if not s["citations"]),
            "answered": bool(answer_sentences),
            "urgent_ok": reply["urgent"] == bool(item.get("urgent")),
            "unanswered": len(reply["unanswered"]),
            "by_model": reply.get("generator", "extractive") != "extractive",
            "model_kept": len(answer_sentences) if reply.get("generator", "extractive") != "extractive" else 0,
            "model_removed": len(reply.get("removed") or []),
            "removed_reasons": [r["reason"] for r in reply.get("removed") or []]}


def evaluate_replies(svc, tenant: str, paths: list[str], words: int = 75) -> dict:
    """Every message of the sets drafted and scored; the configured model drafts when there is one."""
    rows = []
    for path in paths:
        for item in load_messages(path):
            reply = build_reply(svc, tenant, item["patient_id"], item["message"], words=words,
                                use_llm=svc.llm is not None).to_dict()
            row = score_message(item, reply)
            row["source"] = str(path)
            rows.append(row)
    return summary(rows)


def summary(rows: list[dict]) -> dict:
    answerable = [r for r in rows if r["answerable"]]
    chosen = sum(r["chosen"] for r in answerable)
    precision = sum(r["hits"] for r in answerable) / chosen if chosen else 0.0
    gold = sum(r["gold"] for r in answerable)
    recall = sum(r["met"] for r in answerable) / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    with_facts = [r for r in answerable if r["facts"] is not None]
    return {"messages": len(rows), "answerable": len(answerable),
            "evidence_precision": round(precision, 3), "evidence_recall": round(recall, 3), "evidence_f1": round(f1, 3),
            "facts": round(sum(r["facts"] for r in with_facts) / len(with_facts), 3) if with_facts else 0.0,
            "words_median": statistics.median(r["words"] for r in rows) if rows else 0,
            "uncited_sentences": sum(r["uncited"] for r in rows),
            "answered_unanswerable": sum(1 for r in rows if not r["answerable"] and r["answered"]),
            "unanswered_answerable": sum(1 for r in answerable if not r["answered"]),
            "urgent_correct": sum(r["urgent_ok"] for r in rows),
            "model_drafts": sum(r.get("by_model", False) for r in rows),
            "model_sentences_kept": sum(r.get("model_kept", 0) for r in rows),
            "model_sentences_removed": sum(r.get("model_removed", 0) for r in rows),
            "model_removed_why": dict(Counter(reason for r in rows for reason in r.get("removed_reasons", []))),
            "rows": rows}


def format_summary(report: dict) -> str:
    keys = ("messages", "answerable", "evidence_precision", "evidence_recall", "evidence_f1", "facts", "words_median",
            "uncited_sentences", "answered_unanswerable", "unanswered_answerable", "urgent_correct", "model_drafts",
            "model_sentences_kept", "model_sentences_removed", "model_removed_why")
    return "\n".join(f"{k:24} {report[k]}" for k in keys)
