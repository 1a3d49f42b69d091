"""Builds search/reply/data/messages-dev.jsonl: patient-portal messages over the notes-dev patients.

The messages are written by the project (CC0). Each is a patient's or a relative's message of 1-4
sentences with context, made from a notes-dev question; its gold sentences and facts are copied
from that question (notes-dev: MTSamples transcriptions, CC0). Run from the repository with the
notes-dev folder as the argument; the output is committed so evaluation needs no shared data.
"""
import json
import sys
from pathlib import Path

# (notes-dev question id, message, expected urgent)
MESSAGES = [
    ("nd-001", "I'm still confused about my ER visit when I was pregnant. Which side did they say my belly pain was on?", False),
    ("nd-002", "My appendix came out while I was pregnant and I was scared for the baby. What kind of anesthetic did they give me for that surgery?", False),
    ("nd-003", "My daughter had her baby by C-section and we forgot to write things down. How much did the baby weigh?", False),
    ("nd-008", "Thanks for taking care of my appendix. What did pathology say about the appendix they removed?", False),
    ("nd-009", "I'm planning another pregnancy. Did I get my Tdap shot during my last pregnancy?", False),
    ("nd-010", "My dad was moved to another hospital for his heart. Did they rule out a heart attack before the transfer?", False),
    ("nd-011", "My dad is diabetic and I fill his pill box. What dose of Novolin 70/30 is he supposed to take?", False),
    ("nd-016", "My husband keeps asking about his sugar control. What was his last HbA1c?", False),
    ("nd-018", "They did a CT scan of my chest because I was short of breath last year. Did it show a blood clot in my lungs?", False),
    ("nd-019", "I came home from the hospital in 2010 on a steroid taper and lost the paper. What was the prednisone taper schedule?", False),
    ("nd-021", "I'm seeing a new dentist next week. What drug allergies do you have on file for me?", False),
    ("nd-026", "My husband had an EGD for his bleeding. Was the H. pylori result from the EGD positive?", False),
    ("nd-027", "My mom has rheumatoid arthritis and takes a lot of medicines. What is she taking for her RA?", False),
    ("nd-028", "My mother had a stomach bleed and then a scope. What did the upper endoscopy show when she bled?", False),
    ("nd-035", "My mom has heart trouble. What is her ejection fraction?", False),
    ("nd-036", "My neck surgery went well, I think. Which side was my carotid surgery on?", False),
    ("nd-037", "After my heart cath they did not give me Plavix. Why was the Plavix held after the cath?", False),
    ("nd-039", "I had an ultrasound of my neck arteries. What did the carotid duplex show?", False),
    ("nd-043", "I'm worried about my cholesterol. What was the LDL on my last lipid panel?", False),
    ("nd-044", "I have MS and I'm filling out disability forms. When was my MS diagnosed?", False),
    ("nd-046", "My legs have been stiff for years. Which of my legs is more spastic?", False),
    ("nd-047", "I saw the urologist in 2011 about my bladder. What was the plan from that urology visit?", False),
    ("nd-052", "My mom got a pacemaker and the company wants the settings. What are the pacing mode and the lower and upper rates?", False),
    ("nd-053", "My mother had antibiotics after her pacemaker. What was the cefazolin dose and how many doses did she get?", False),
    ("nd-058", "My mom's pacemaker was checked recently. What was the battery status at the last device check?", False),
    ("nd-059", "My husband had a stroke in 2001. What did his carotid ultrasound in the ER show?", False),
    ("nd-061", "My husband had his second stroke in 2003. Did he get physical therapy after that stroke?", False),
    ("nd-065", "My husband had a stroke. Was he given tPA?", False),
    ("nd-066", "He coughs when he drinks water. What were the results of his swallow study?", False),
    ("nd-067", "My mother fell and broke her hip. Which hip is broken?", False),
    ("nd-068", "I had my hip surgery and I'm feeling weak. How much blood did I lose during the hip surgery?", False),
    ("nd-073", "I have melanoma. Am I on immunotherapy for the melanoma?", False),
    ("nd-074", "My dad takes a blood thinner. What is his Coumadin dose?", False),
    ("nd-075", "My dad had a kidney stone in 2007. What size was the stone and where was it on the CT urogram?", False),
    ("nd-080", "My father passed a stone. What was the stone made of?", False),
    ("nd-082", "My dad has a bone infection in his foot. What IV antibiotic did the infectious disease doctor start and at what dose?", False),
    ("nd-084", "They worried about a bone infection in my foot. Did the MRI and bone scan show osteomyelitis?", False),
    ("nd-088", "My husband's foot wound is not healing and we are scared. Is an amputation planned?", False),
    ("nd-089", "My son got ear tubes. What kind of ear infection did he have before the tubes?", False),
    ("nd-094", "My son had his tonsils out. What were his hearing test results?", False),
    # context, two questions, urgent
    ("nd-057", "My mom's chest hurts on the left side right now and she can't breathe well. Is that normal after the pacemaker?", True),
    ("nd-072", "I had a CT scan of my chest before my hip surgery. I'm having chest pain right now. Did the scan show the cancer in my lungs?", True),
]


def main(notes_dev: str) -> None:
    questions = {q["id"]: q for q in map(json.loads, Path(notes_dev, "questions.jsonl").read_text(encoding="utf-8").splitlines())}
    out = Path(__file__).resolve().parents[1] / "search" / "reply" / "data" / "messages-dev.jsonl"
    rows = []
    for i, (qid, message, urgent) in enumerate(MESSAGES, 1):
        q = questions[qid]
        sentence = q.get("sentence")
        gold = [] if sentence is None else [[sentence]] if isinstance(sentence, str) else \
            [item if isinstance(item, list) else [item] for item in sentence]
        rows.append({"id": f"rm-{i:03d}", "from": qid, "patient_id": q["patient_id"], "message": message,
                     "answerable": q["answerable"], "gold": gold, "facts": q["facts"], "urgent": urgent})
    out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(f"{len(rows)} messages -> {out}")


if __name__ == "__main__":
    main(sys.argv[1])
