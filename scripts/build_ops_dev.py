"""Build tests/data/ops-dev.jsonl: questions that need arithmetic over the record (counts, windows,
durations, changes, comparisons, visit facts), with their gold computed from the bundles.

    python scripts/build_ops_dev.py [SHARED_DATA_DIR] > tests/data/ops-dev.jsonl

Only the shared Synthea patients listed for new questions
(`questions/patients-for-new-questions.txt`) are asked about. Every question is a template in a
clinician's words, filled from the patient's bundle; its gold (the counted resources, the count,
the dates, values and places a correct answer states) is read from the same bundle here, never
typed by hand, so the file is reproduced exactly by running this script again. `today` is fixed
(TODAY) so that "in the last year" means the same year on every run.
"""
from __future__ import annotations

import gzip
import json
import re
import sys
from datetime import date
from pathlib import Path

TODAY = date(2025, 8, 1)
CLASS_WORDS = {"EMER": ["ED visits", "ER visits", "emergency visits"],
               "AMB": ["office visits", "outpatient visits", "clinic visits"],
               "HH": ["home health visits", "home visits"],
               "IMP": ["admissions", "inpatient stays", "hospitalizations"]}
OBSERVATIONS = {"85354-9": ("bp readings", "blood pressure"), "39156-5": ("bmi readings", "BMI"),
                "29463-7": ("weights", "weight"), "2093-3": ("cholesterol checks", "cholesterol")}

# Compared measurements, in the order tried (the blood pressure panel is two values, not one).
COMPARED = (("4548-4", "a1c"), ("39156-5", "BMI"), ("29463-7", "weight"), ("2093-3", "cholesterol"))


def back(day: date, years: int = 0, months: int = 0) -> date:
    total = day.year * 12 + day.month - 1 - years * 12 - months
    return date(total // 12, total % 12 + 1, min(day.day, 28))


def resources(shared: Path, patient_id: str) -> list[dict]:
    with gzip.open(shared / "synthea" / f"{patient_id}.json.gz", "rt", encoding="utf-8") as fh:
        return [e["resource"] for e in json.load(fh)["entry"]]


def start(r: dict) -> str:
    return (r.get("period") or {}).get("start", "")[:10]


def end(r: dict) -> str:
    return (r.get("period") or {}).get("end", "")[:10]


def ref(r: dict) -> str:
    return f"{r['resourceType']}/{r['id']}"


def untagged(words: str) -> str:
    """A SNOMED display without its semantic tag: "Overdose (disorder)" -> "Overdose"."""
    return re.sub(r"\s*\((?:disorder|finding|procedure|situation|regime/therapy|qualifier value)\)$", "", words)


def display(concept: dict | None) -> str:
    concept = concept or {}
    return concept.get("text") or ((concept.get("coding") or [{}])[0].get("display") or "")


class Questions:
    def __init__(self):
        self.rows: list[dict] = []

    def add(self, pid: str, question: str, kind: str, gold: list[list[str]], facts: list[str], count: int | None = None):
        row = {"id": f"ops-{len(self.rows) + 1:03d}", "patient_id": pid, "question": question, "kind": kind,
               "answerable": True, "gold": gold, "facts": facts, "today": TODAY.isoformat()}
        if count is not None:
            row["count"] = count
        self.rows.append(row)


def visit_questions(out: Questions, pid: str, rs: list[dict], turn: int) -> None:
    encounters = sorted((r for r in rs if r["resourceType"] == "Encounter"), key=start)
    by_class = {}
    for r in encounters:
        by_class.setdefault(r["class"]["code"], []).append(r)
    rarest_first = sorted(by_class.items(), key=lambda kv: (len(kv[1]), kv[0]))
    for code, visits in rarest_first:
        if code not in CLASS_WORDS:
            continue
        words = CLASS_WORDS[code][turn % len(CLASS_WORDS[code])]
        # All time, and a window relative to today.
        out.add(pid, f"how many {words} has she had" if turn % 2 else f"# of {words}", "count",
                [[ref(v)] for v in visits[-5:]], [str(len(visits))], len(visits))
        since = back(TODAY, years=2)
        inside = [v for v in visits if start(v) >= since.isoformat()]
        out.add(pid, f"how many {words} in the last 2 years", "window", [[ref(v)] for v in inside[-5:]],
                [str(len(inside))] if inside else [], len(inside))
        last = visits[-1]
        if code in ("EMER", "IMP"):
            reason = untagged(display((last.get("reasonCode") or [None])[0])).lower()
            place = (last.get("serviceProvider") or {}).get("display", "").lower()
            # What each question asks: the reason, or the place (and the reason when it asks why too).
            asked = [("reason for the last ED visit" if code == "EMER" else "why was she admitted last time",
                      [start(last)] + ([reason] if reason else [])),
                     ("where did the last ER trip happen and why" if code == "EMER" else "which hospital for the last admission",
                      [start(last)] + ([place] if place else []) + ([reason] if reason and code == "EMER" else []))]
            question, facts = asked[turn % 2]
            out.add(pid, question, "visit", [[ref(last)]], facts)
        if code == "IMP" and end(last):
            days = (date.fromisoformat(end(last)) - date.fromisoformat(start(last))).days
            out.add(pid, ["how long was the last hospital stay", "LOS for the last admission?"][turn % 2], "duration",
                    [[ref(last)]], [start(last), end(last)] + ([f"{days} day"] if days else []))
            out.add(pid, "when did she get home after the last admission", "duration", [[ref(last)]], [end(last)])


def observation_questions(out: Questions, pid: str, rs: list[dict], turn: int) -> None:
    observations = [r for r in rs if r["resourceType"] == "Observation"]
    for code, (plural, name) in OBSERVATIONS.items():
        found = sorted((r for r in observations if r["code"]["coding"][0]["code"] == code),
                       key=lambda r: r.get("effectiveDateTime", ""))
        if len(found) < 3:
            continue
        since = f"{TODAY.year - 3}-01-01"
        inside = [r for r in found if r.get("effectiveDateTime", "")[:10] >= since]
        out.add(pid, f"how many {plural} since {TODAY.year - 3}", "count", [[ref(r)] for r in inside[-5:]],
                [str(len(inside))] if inside else [], len(inside))
        return       # one measurement per patient keeps the set varied


def compare_questions(out: Questions, pid: str, rs: list[dict]) -> None:
    """One comparison per patient, of the first measurement of COMPARED measured both in a year and
    after it: "a1c better or worse than 2023?" (after the year against it) or, every other one
    when the latest is of this year, "a1c now vs last year" (this year against the last)."""
    observations = [r for r in rs if r["resourceType"] == "Observation" and r.get("valueQuantity", {}).get("value") is not None]
    for code, name in COMPARED:
        found = sorted((r for r in observations if r["code"]["coding"][0]["code"] == code),
                       key=lambda r: r.get("effectiveDateTime", ""))
        if not found:
            continue
        latest = found[-1]
        year = int(latest["effectiveDateTime"][:4]) - 1
        question = f"{name} better or worse than {year}?"
        asked_before = sum(1 for row in out.rows if row["kind"] == "compare")
        if asked_before % 2 and latest["effectiveDateTime"][:4] == str(TODAY.year):
            question = f"{name} now vs last year"
        before = [r for r in found if r["effectiveDateTime"][:4] == str(year)]
        if before:
            out.add(pid, question, "compare", [[ref(latest)], [ref(before[-1])]],
                    [fmt(latest["valueQuantity"]["value"]), fmt(before[-1]["valueQuantity"]["value"])])
            return


def fmt(value: float) -> str:
    return f"{value:g}"


def medication_questions(out: Questions, pid: str, rs: list[dict], turn: int) -> None:
    orders = sorted((r for r in rs if r["resourceType"] == "MedicationRequest"), key=lambda r: r.get("authoredOn", ""))
    since = back(TODAY, years=1).isoformat()
    recent = [r for r in orders if r.get("authoredOn", "")[:10] >= since]
    out.add(pid, ["how many prescriptions in the last year", "# of rx written in the past 12 months"][turn % 2],
            "window", [[ref(r)] for r in recent[-5:]], [str(len(recent))] if recent else [], len(recent))
    by_ingredient: dict[str, list[dict]] = {}
    for r in orders:
        text = display(r.get("medicationCodeableConcept"))
        words = text.split()
        if len(words) > 2 and words[1][0].isdigit():
            by_ingredient.setdefault(words[0].lower(), []).append(r)
    for drug, drug_orders in sorted(by_ingredient.items()):
        doses = list(dict.fromkeys(display(r["medicationCodeableConcept"]).split()[1] for r in drug_orders))
        if len(drug_orders) >= 2:
            facts = [f"{d} mg" for d in doses[:2]]
            out.add(pid, f"dose change on {drug}?", "change", [[ref(r) for r in drug_orders]], facts)
            return


def main(shared: Path) -> None:
    listed = (shared / "questions" / "patients-for-new-questions.txt").read_text(encoding="utf-8").splitlines()
    patients = [line.strip() for line in listed if line.strip() and not line.startswith("#")]
    out = Questions()
    for turn, pid in enumerate(patients):
        rs = resources(shared, pid)
        visit_questions(out, pid, rs, turn)
        observation_questions(out, pid, rs, turn)
        compare_questions(out, pid, rs)
        medication_questions(out, pid, rs, turn)
    for n, row in enumerate(kept(out.rows), start=1):
        print(json.dumps(dict(row, id=f"ops-{n:03d}")))


PER_PATIENT = {"count": 2, "window": 1, "duration": 1}     # of each patient's counts, the first few (rarest classes first)


def kept(rows: list[dict]) -> list[dict]:
    """About sixty questions: every visit, duration, change and comparison question, and of the
    counts, the first of each patient's (the classes are tried rarest first)."""
    seen: dict[tuple[str, str], int] = {}
    out = []
    for row in rows:
        key = (row["patient_id"], row["kind"])
        seen[key] = seen.get(key, 0) + 1
        if seen[key] <= PER_PATIENT.get(row["kind"], 99):
            out.append(row)
    return out


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "shared" / "data")
