"""Reading a patient's message: the questions in it (a message carries context and feelings as
well as questions), and whom it is about ("my dad" makes the draft say "your dad")."""
from __future__ import annotations

import re

from fhir_ingest.record.notes import note_sentences

# A sentence asks when it ends with "?" or opens with a request for information.
REQUEST = re.compile(r"^\s*(?:(?:can|could|would) you (?:please )?(?:tell|explain|let) me|please (?:tell|explain|let)|"
                     r"i (?:want|would like|'d like|need) to (?:know|understand)|i(?:'m| am) (?:wondering|worried|not sure)|"
                     r"i was wondering|i wonder|do you know|i don't understand)\b", re.I)
INTERROGATIVE = re.compile(r"^\s*(?:is|was|are|were|does|did|do|has|have|had|what|which|when|why|how|should|could|"
                           r"can|will|who|where)\b", re.I)
CONTEXT_SENTENCES = 2     # the sentences of context read with a question
RELATIONS = ("dad", "father", "mom", "mother", "husband", "wife", "son", "daughter", "brother", "sister", "grandmother",
             "grandfather", "grandma", "grandpa", "partner", "baby", "child", "boy", "girl")
RELATION = re.compile(rf"\bmy\s+({'|'.join(RELATIONS)})\b", re.I)
MOST_QUESTIONS = 4
GREETING = re.compile(r"^\s*(?:hi|hello|hey|dear|good (?:morning|afternoon|evening)|thanks?|thank you|regards|best|"
                      r"sincerely)\b", re.I)


def sentences(message: str) -> list[str]:
    """The message's sentences (PyRuSH's rules, as the notes are split), each on one line."""
    # PyRuSH keeps "We were worried! What size was it?" together: a "!" or "?" before a capital ends one.
    return [part for s in note_sentences(message) for part in re.split(r"(?<=[!?])\s+(?=[A-Z])", " ".join(s.text.split()))
            if part.strip()]


def asks(sentence: str) -> bool:
    return sentence.rstrip().endswith("?") or bool(REQUEST.match(sentence)) or \
        (bool(INTERROGATIVE.match(sentence)) and not sentence.rstrip().endswith("!"))


def questions_in(message: str) -> list[tuple[str, str]]:
    """The message's questions, in order: each as asked, and as read (with the sentences of context
    before it: "My dad had a kidney stone in 2007. What size was it?"). A message with no question
    mark or request is one question as a whole (a worry stated is still what the patient asks)."""
    said = sentences(message)
    found, context = [], []
    for sentence in said:
        if not asks(sentence):
            if not GREETING.match(sentence):       # "Hi, this is ..." says nothing the record could answer
                context.append(sentence)
            continue
        found.append((sentence, " ".join(context[-CONTEXT_SENTENCES:] + [sentence])))
    if not found and message.strip():
        whole = " ".join(message.split())
        found = [(whole, whole)]
    return found[:MOST_QUESTIONS]


OPENS_WITH_RELATION = re.compile(rf"^\s*(?:my\s+)?({'|'.join(RELATIONS)})\b", re.I)
FIRST_PERSON = re.compile(r"\b(?:i|me|my|mine|myself)\b", re.I)


def about_whom(message: str) -> str:
    """"your dad" when the writer asks about a relative, else "you"; said in the draft. A relative
    named in passing ("my sister keeps asking", "I left it at my mom's") is not whom the message is
    about: the question's own relative comes first, then a question in the first person ("What
    was my surgery?"), then a sentence whose subject is a relative ("My dad had a stroke.")."""
    said = sentences(message)
    asked = [s for s in said if asks(s)] or said
    for sentence in asked:
        m = RELATION.search(sentence)
        if m:
            return f"your {m.group(1).lower()}"
    if any(FIRST_PERSON.search(s) for s in asked):
        return "you"
    for sentence in said:
        m = OPENS_WITH_RELATION.match(sentence)
        if m:
            return f"your {m.group(1).lower()}"
    return "you"


# "Is this my heart disease again?", "Could it be a stroke?": the writer asks what is happening to
# them now. The record holds what was found before, not what this is: quoting "ischemic heart
# disease" under that question would read as a diagnosis, so such a question goes to the care
# team. ("Is it normal after...?" and "Is that written in my chart?" are not of this form.)
NAMING_NOW = re.compile(r"^\W*(?:is|could|can|might) (?:this|it|that) (?:be |just )?(?:my|his|her|their|a|an)\b", re.I)


def asks_to_name_what_happens_now(question: str) -> bool:
    return bool(NAMING_NOW.search(question))
