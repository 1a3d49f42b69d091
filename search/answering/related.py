"""What the record holds next to an asked thing it lacks, said as what it is.

Asked about amoxicillin, a recorded penicillin V anaphylaxis is not "an amoxicillin allergy", but a
clinician must see it first: an allergy of the same class. Asked for an anticoagulant, clopidogrel
is not one; it is an antiplatelet, a neighbouring class, and is named as such, never under "Yes".
Asked about warfarin, a recorded apixaban is another anticoagulant. The classes come from the
maintained terminology (search/nlp/terminology.py): allergy classes and their cross-reactivity
(with its risk), class membership, and classes that share a broader class.
"""
from __future__ import annotations

from dataclasses import dataclass

from search.nlp import terminology
from search.nlp.annotate import asserted_keys
from search.nlp.lexicon import lexicon_key
from search.retrieval.types import Analysis, Evidence


@dataclass
class Related:
    ev: Evidence
    why: str            # "an allergy of the same class as amoxicillin (penicillin)"


def related_reasons(analysis: Analysis, klass: str) -> dict[str, str]:
    """Concept key -> why an entry asserting it is related to what was asked, strongest first."""
    asked = [c for c in analysis.concepts if c.get("role") not in ("context", "class", "record")
             and c["semantic_type"] == "medication"]
    reasons: dict[str, str] = {}
    for concept in asked:
        name = concept["display"]
        if klass == "allergy":
            for cross in by_closeness(terminology.cross_reactions(name)):
                why = (f"an allergy of the same class as {name} ({cross.other})" if cross.risk == "same class"
                       else f"{cross.other}, which may cross-react with {name}: {cross.risk}")
                reasons.setdefault(lexicon_key(cross.other), why)
        elif terminology.clinical_class(name):
            for other in sorted(terminology.neighbouring_classes(name)):
                reasons.setdefault(lexicon_key(other), f"{other}, a class beside {name}, not one")
        else:
            narrowest = sorted(terminology.classes_of(name, epc=False), key=lambda c: len(terminology.members_of(c)))
            for other in narrowest:
                reasons.setdefault(lexicon_key(other), f"also {article(other)} {other}, like {name}")
    return reasons


def by_closeness(reactions) -> list:
    """The drug's own narrowest allergy class first (penicillins), then the classes that may
    cross-react (cephalosporins, with their risk), then its broader classes (beta-lactams)."""
    own = sorted((r for r in reactions if r.risk == "same class"), key=lambda r: len(terminology.members_of(r.other)))
    cross = [r for r in reactions if r.risk != "same class"]
    return own[:1] + cross + own[1:]


def article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def closest_first(entries: list[Evidence], analysis: Analysis, klass: str,
                  ranked: list[Evidence]) -> tuple[list[Related], list[Evidence]]:
    """The entries related to what was asked (with why), then the others, those the question's
    retrieval ranked first before the rest (which stay current first, newest first)."""
    reasons = related_reasons(analysis, klass)
    order = list(reasons)
    related, others = [], []
    for ev in entries:
        hits = [k for k in order if k in asserted_keys(ev.chunk.concepts)]
        if hits:
            related.append((order.index(hits[0]), Related(ev, reasons[hits[0]])))
        else:
            others.append(ev)
    rank = {ev.chunk.chunk_id: i for i, ev in enumerate(ranked)}
    others.sort(key=lambda ev: rank.get(ev.chunk.chunk_id, len(rank)))
    return [r for _, r in sorted(related, key=lambda pair: pair[0])], others
