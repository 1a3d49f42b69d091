"""Summary drafts from the structured record: a pre-visit summary and a medication review, in
FINDINGS / ASSESSMENT / ITEMS TO REVIEW, every line citing the record it came from.

Drafts are proposals for the clinician to read and edit; nothing here is saved or sent anywhere.
The lines are assembled from the context bundle (structured facts only), so each one is true of
the record it cites by construction.
"""
from __future__ import annotations

from datetime import date

from search.nlp.annotate import default_annotator

KINDS = {"pre-visit": "Pre-visit summary", "medication-review": "Medication review"}
STALE_DAYS = 365


class DraftBuilder:
    def __init__(self, kind: str, bundle: dict, today: date | None = None):
        if kind not in KINDS:
            raise ValueError(f"draft kind must be one of {', '.join(KINDS)}")
        self.kind, self.bundle = kind, bundle
        self.today = today or date.today()
        self.citations: list[dict] = []
        self.numbers: dict[str, int] = {}
        self.sections = {"FINDINGS": [], "ASSESSMENT": [], "ITEMS TO REVIEW": []}

    def cite(self, ref: str, label: str) -> int:
        if ref not in self.numbers:
            self.numbers[ref] = len(self.citations) + 1
            self.citations.append({"n": self.numbers[ref], "ref": ref, "label": label})
        return self.numbers[ref]

    def line(self, section: str, text: str, *items: dict) -> None:
        marks = [self.cite(i["ref"], i.get("name") or i.get("type") or i["ref"]) for i in items]
        if marks:
            self.sections[section].append({"text": text, "citations": marks})

    def days_since(self, iso: str) -> int | None:
        try:
            return (self.today - date.fromisoformat(iso[:10])).days
        except ValueError:
            return None

    def build(self) -> dict:
        (self.pre_visit if self.kind == "pre-visit" else self.medication_review)()
        return {"kind": self.kind, "title": KINDS[self.kind], "draft": True,
                "sections": [{"title": t, "lines": lines} for t, lines in self.sections.items()],
                "citations": self.citations}

    def pre_visit(self) -> None:
        b = self.bundle
        for p in b["problems"]:
            self.line("FINDINGS", f"Problem: {p['name']} (since {p['since'] or 'date not recorded'}).", p)
        for a in b["allergies"]:
            self.line("FINDINGS", f"Allergy: {a['name']}" + (f", reactions {', '.join(a['reactions'])}" if a["reactions"] else "") + ".", a)
        for v in b["vitals"]:
            self.line("FINDINGS", f"{v['name']}: {v['value']} on {v['date']}.", v)
        for lab in b["labs"]:
            self.line("FINDINGS", f"{lab['name']}: {lab['value']} on {lab['date']}" + (f" ({lab['flag']})" if lab["flag"] else "") + ".", lab)
        flagged = [lab for lab in b["labs"] if lab["flag"]]
        for lab in flagged:
            self.line("ASSESSMENT", f"Latest {lab['name']} is flagged {lab['flag']}: {lab['value']} on {lab['date']}.", lab)
        if b["encounters"]:
            last = b["encounters"][0]
            self.line("ASSESSMENT", f"Last visit {last['date']}: {last['type'] or last['class']}.", last)
            gap = self.days_since(last["date"])
            if gap is not None and gap > STALE_DAYS:
                self.line("ITEMS TO REVIEW", f"No visit recorded for {gap // 30} months (last {last['date']}).", last)
        for lab in b["labs"]:
            age = self.days_since(lab["date"])
            if age is not None and age > STALE_DAYS and lab["flag"]:
                self.line("ITEMS TO REVIEW", f"{lab['name']} was last measured {lab['date']} and was {lab['flag']}: "
                                             "consider repeating.", lab)
        for m in b["medications"]:
            if not m["reason"]:
                self.line("ITEMS TO REVIEW", f"{m['name']} has no recorded reason.", m)

    def medication_review(self) -> None:
        b = self.bundle
        for m in b["medications"]:
            dose = m["dose"] or "dose not recorded"
            self.line("FINDINGS", f"{m['name']}: {dose}" + (f"; for {m['reason']}" if m["reason"] else "") + f" (since {m['since']}).", m)
        for a in b["allergies"]:
            self.line("FINDINGS", f"Allergy: {a['name']}" + (f" (criticality {a['criticality']})" if a["criticality"] else "") + ".", a)
        if b["medications"]:
            self.line("ASSESSMENT", f"{len(b['medications'])} active medication order(s) on record.", *b["medications"])
        for group in duplicate_classes(b["medications"]):
            names = ", ".join(m["name"] for m in group["members"])
            self.line("ITEMS TO REVIEW", f"More than one {group['class']}: {names}.", *group["members"])
        for m in b["medications"]:
            if not m["dose"]:
                self.line("ITEMS TO REVIEW", f"{m['name']} has no dose instructions.", m)
            if not m["reason"]:
                self.line("ITEMS TO REVIEW", f"{m['name']} has no recorded reason.", m)
            age = self.days_since(m["since"])
            if age is not None and age > STALE_DAYS:
                self.line("ITEMS TO REVIEW", f"{m['name']} was ordered {m['since']}: confirm it is still taken.", m)


def duplicate_classes(medications: list[dict]) -> list[dict]:
    """Active drugs that share a class in the shipped lexicon (two statins, two ACE inhibitors)."""
    annotated = default_annotator().annotate([m["name"] for m in medications])
    by_class: dict[str, list[dict]] = {}
    for med, concepts in zip(medications, annotated):
        for c in concepts:
            if c.get("role") == "class" and c["semantic_type"] == "medication":
                by_class.setdefault(c["display"], [])
                if med not in by_class[c["display"]]:
                    by_class[c["display"]].append(med)
    return [{"class": cls, "members": meds} for cls, meds in sorted(by_class.items())
            if len({m["name"] for m in meds}) > 1]
