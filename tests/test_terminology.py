"""The terminology layer (search/nlp/terminology.py over search/nlp/data/terminology/, issue 28):
brand and salt names reach their RxNorm ingredient, classes mean what clinicians mean by them
(anticoagulants are not antiplatelets), allergy cross-reactivity is what the guidance says,
vaccine and lab shorthand reach CDC groups and LOINC codes, abbreviations read by context, and
spelling correction fixes typos without ever turning one drug into another. Every data file says
where it came from and under what licence, and the built ones are what the build script makes
from their pinned sources."""
from __future__ import annotations

import gzip
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from search.nlp import spelling as S
from search.nlp import terminology as T

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "search" / "nlp" / "data" / "terminology"
BUILT = ["abbreviations.tsv", "cvx.tsv", "drug_brands.tsv", "drug_classes.tsv", "drug_ingredients.tsv",
         "english_words.txt.gz", "loinc_check.tsv", "loinc_conversion.tsv"]
HAND = ["abbreviation_overrides.tsv", "clinical_classes.tsv", "cross_reactivity.tsv", "drug_words.tsv",
        "lab_groups.tsv", "labs.tsv", "vaccine_shorthand.tsv"]


def rows(name: str) -> list[dict[str, str]]:
    return T._rows(name)


# --- drugs -------------------------------------------------------------------------------------

@pytest.mark.parametrize("word, ingredient", [
    ("Eliquis", "apixaban"), ("Lasix", "furosemide"), ("Plavix", "clopidogrel"), ("Effient", "prasugrel"),
    ("Nexplanon", "etonogestrel"), ("Lipitor", "atorvastatin"), ("Coumadin", "warfarin"), ("Xanax", "alprazolam"),
    ("Zantac", "ranitidine"), ("Klonopin", "clonazepam"), ("Celebrex", "celecoxib"), ("Cerebyx", "fosphenytoin"),
])
def test_a_brand_name_reaches_its_ingredient(word, ingredient):
    assert T.ingredient_of(word) == ingredient
    assert T.is_brand(word)


def test_fosamax_and_the_records_alendronic_acid_are_one_ingredient():
    assert T.ingredient_of("Fosamax") == T.ingredient_of("alendronic acid") == T.ingredient_of("alendronate")
    assert T.ingredient_of("Alendronic acid") == "alendronate"


@pytest.mark.parametrize("word, ingredients", [
    ("Norco", {"acetaminophen", "hydrocodone"}), ("Percocet", {"acetaminophen", "oxycodone"}),
    ("Augmentin", {"amoxicillin", "clavulanate"}), ("Bactrim", {"sulfamethoxazole", "trimethoprim"}),
    ("Yaz", {"drospirenone", "ethinyl estradiol"}),
])
def test_a_combination_brand_gives_each_ingredient(word, ingredients):
    assert T.ingredients_of(word) == ingredients
    assert T.ingredient_of(word) is None                    # no single ingredient to name


@pytest.mark.parametrize("name, ingredient", [
    # as RxNorm clinical drug names and the records write them
    ("Hydrochlorothiazide", "hydrochlorothiazide"), ("amLODIPine", "amlodipine"), ("warfarin sodium", "warfarin"),
    ("atorvastatin calcium trihydrate", "atorvastatin"), ("Oxycodone Hydrochloride", "oxycodone"),
    ("insulin isophane, human", "insulin isophane"), ("heparin sodium, porcine", "heparin"),
    ("nitrofurantoin, macrocrystals", "nitrofurantoin"), ("Levothyroxine Sodium", "levothyroxine"),
    ("protamine sulfate (USP)", "protamine sulfate (usp)"), ("(Eliquis)", "apixaban"), ("Eliquis®", "apixaban"),
    # international names, shorthand, ester names, withdrawn drugs the records still hold
    ("paracetamol", "acetaminophen"), ("salbutamol", "albuterol"), ("hctz", "hydrochlorothiazide"),
    ("tacro", "tacrolimus"), ("dabigatran", "dabigatran etexilate"), ("Astemizole", "astemizole"),
])
def test_salt_forms_synonyms_and_shorthand_reach_the_ingredient(name, ingredient):
    assert T.ingredient_of(name) == ingredient


@pytest.mark.parametrize("drug_name, ingredients", [
    ("Acetaminophen 325 MG / Oxycodone Hydrochloride 10 MG Oral Tablet [Percocet]", {"acetaminophen", "oxycodone"}),
    ("24 HR metoprolol succinate 100 MG Extended Release Oral Tablet", {"metoprolol"}),
    ("Abuse-Deterrent 12 HR Oxycodone Hydrochloride 10 MG Extended Release Oral Tablet [Oxycontin]", {"oxycodone"}),
    ("NDA020800 0.3 ML Epinephrine 1 MG/ML Auto-Injector", {"epinephrine"}),
    ("insulin isophane, human 70 UNT/ML / insulin, regular, human 30 UNT/ML Injectable Suspension [Humulin]",
     {"insulin isophane", "insulin, regular, human"}),
    ("Alendronic acid 10 MG Oral Tablet", {"alendronate"}), ("Sulfamethoxazole / Trimethoprim", {"sulfamethoxazole", "trimethoprim"}),
    ("Tylenol PM Pill", {"acetaminophen", "diphenhydramine"}), ("Yaz 28 Day Pack", {"drospirenone", "ethinyl estradiol"}),
    ("Liletta 52 MG Intrauterine System", {"levonorgestrel"}), ("1 ML heparin sodium, porcine 5000 UNT/ML Injection", {"heparin"}),
    ("Nizatidine 15 MG/ML Oral Solution [Axid]", {"nizatidine"}), ("Astemizole 10 MG Oral Tablet", {"astemizole"}),
    ("Seasonal allergies", set()),
])
def test_a_medication_name_as_recorded_gives_its_ingredients(drug_name, ingredients):
    assert T.ingredients_in(drug_name) == ingredients


def test_rxnorm_codes_come_with_the_ingredients():
    assert T.rxcui("warfarin") == "11289"
    assert T.rxcui("lisinopril") == "29046"
    assert T.rxcui("Eliquis") == "1364430"                  # an "A" ingredient, from the 2023 RxNorm names
    assert T.rxcui("Astemizole") is None                    # withdrawn: no RxNorm concept in the sources


def test_unknown_words_are_not_drugs():
    assert T.ingredients_of("tree pollen") == frozenset()
    assert T.ingredient_of("") is None
    assert not T.is_brand("metformin")


def test_drug_names_gather_what_the_record_may_say():
    names = T.drug_names("apixaban")
    assert {"apixaban", "eliquis"} <= names
    assert "warfarin" not in names


def test_hand_drug_words_never_shadow_an_ingredient():
    ingredients = {r["ingredient"] for r in rows("drug_ingredients.tsv")}
    for r in rows("drug_words.tsv"):
        if "withdrawn" in r["note"]:
            assert r["word"] not in ingredients and r["ingredients"] == r["word"]
        else:
            assert r["word"] not in ingredients, r["word"]
            assert set(r["ingredients"].split("|")) <= ingredients, r


# --- classes and cross-reactivity --------------------------------------------------------------

def test_anticoagulants_are_not_antiplatelets():
    anticoagulants = T.members_of("anticoagulant")
    assert {"warfarin", "apixaban", "rivaroxaban", "heparin", "enoxaparin", "dabigatran etexilate"} <= anticoagulants
    assert not {"clopidogrel", "prasugrel", "aspirin", "potassium citrate"} & anticoagulants
    assert {"clopidogrel", "prasugrel", "aspirin", "ticagrelor"} <= T.members_of("antiplatelet")


@pytest.mark.parametrize("word, cls", [
    ("blood thinners", "anticoagulant"), ("anticoagulants", "anticoagulant"), ("beta-lactams", "beta-lactam antibacterial"),
    ("beta lactam", "beta-lactam antibacterial"), ("water pill", "diuretic"), ("water pills", "diuretic"),
    ("PCN", "penicillin"), ("statins", "statin"), ("SSRIs", "ssri"), ("abx", "antibiotic"), ("BP meds", "antihypertensive"),
    ("beta blockers", "beta blocker"), ("sulfa", "sulfonamide antibacterial"), ("DOACs", "direct oral anticoagulant"),
    ("antipsychotics", "antipsychotic"), ("birth control", "hormonal contraceptive"), ("PPI", "proton pump inhibitor"),
])
def test_class_words_name_their_class(word, cls):
    assert T.clinical_class(word) == cls


def test_ordinary_words_name_no_class():
    for word in ("loop", "first", "drug", "ace", "lasix"):
        assert T.clinical_class(word) is None, word


@pytest.mark.parametrize("cls, members, not_members", [
    ("beta-lactam antibacterial", {"amoxicillin", "penicillin v", "cephalexin", "ceftriaxone", "meropenem", "aztreonam"},
     {"ciprofloxacin", "clavulanate", "azithromycin"}),
    ("penicillin", {"amoxicillin", "penicillin v", "penicillin g", "piperacillin"}, {"cephalexin"}),
    ("statin", {"atorvastatin", "simvastatin", "rosuvastatin", "pravastatin", "lovastatin"}, {"ezetimibe"}),
    ("beta blocker", {"metoprolol", "atenolol", "labetalol", "carvedilol", "propranolol"}, {"tamsulosin"}),
    ("diuretic", {"hydrochlorothiazide", "chlorthalidone", "furosemide", "spironolactone", "bumetanide"}, {"acetazolamide"}),
    ("nsaid", {"ibuprofen", "naproxen", "meloxicam", "celecoxib", "ketorolac"}, {"acetaminophen"}),
    ("antihypertensive", {"lisinopril", "amlodipine", "hydrochlorothiazide", "metoprolol", "losartan", "clonidine"},
     {"tamsulosin", "tizanidine", "dexmedetomidine", "sildenafil"}),
    ("opioid", {"oxycodone", "hydrocodone", "tramadol", "fentanyl", "morphine", "buprenorphine"}, {"loperamide", "naloxone"}),
    ("ssri", {"sertraline", "fluoxetine", "escitalopram"}, {"trazodone", "duloxetine"}),
    ("antidepressant", {"sertraline", "duloxetine", "bupropion", "mirtazapine", "trazodone", "amitriptyline"}, {"rasagiline"}),
    ("sulfonamide antibacterial", {"sulfamethoxazole"}, {"hydrochlorothiazide", "furosemide", "celecoxib", "glipizide"}),
    ("insulin", {"insulin glargine", "insulin lispro", "insulin isophane", "insulin, regular, human"}, {"metformin"}),
    ("anticonvulsant", {"levetiracetam", "lamotrigine", "phenytoin", "gabapentin", "topiramate"}, set()),
    ("antipsychotic", {"haloperidol", "quetiapine", "risperidone", "olanzapine"}, {"promethazine", "prochlorperazine"}),
    ("corticosteroid", {"prednisone", "dexamethasone", "methylprednisolone", "hydrocortisone"}, {"testosterone"}),
    ("bisphosphonate", {"alendronate", "risedronate", "zoledronic acid"}, set()),
    ("hormonal contraceptive", {"etonogestrel", "levonorgestrel", "norethindrone", "drospirenone"}, {"estradiol", "megestrol"}),
    ("immunosuppressant", {"tacrolimus", "cyclosporine", "mycophenolate mofetil", "azathioprine", "sirolimus"}, {"pimecrolimus"}),
    ("proton pump inhibitor", {"omeprazole", "pantoprazole"}, {"famotidine"}),
    ("benzodiazepine", {"alprazolam", "lorazepam", "clonazepam", "diazepam"}, {"zolpidem"}),
    ("antihistamine", {"loratadine", "cetirizine", "diphenhydramine", "astemizole"}, {"benztropine"}),
])
def test_class_members(cls, members, not_members):
    got = T.members_of(cls)
    assert members <= got, members - got
    assert not got & not_members, got & not_members


def test_a_drug_knows_its_classes():
    assert {"loop diuretic", "diuretic", "antihypertensive", "Loop Diuretic"} <= T.classes_of("Lasix")
    assert {"opioid", "pain medication"} <= T.classes_of("Norco")
    assert "anticoagulant" not in T.classes_of("Plavix") and "antiplatelet" in T.classes_of("Plavix")
    assert "HMG-CoA Reductase Inhibitor" in T.epc_of("atorvastatin")
    assert T.classes_of("Lasix", epc=False) == {"loop diuretic", "diuretic", "antihypertensive"}


def test_penicillin_allergy_reaches_the_other_beta_lactams_and_nothing_else():
    for drug in ("amoxicillin", "Augmentin", "penicillin V", "PCN"):
        got = T.cross_reactive(drug)
        assert {"penicillin", "beta-lactam antibacterial", "cephalosporin", "carbapenem"} <= got, drug
        assert not {"antibiotic", "fluoroquinolone", "macrolide", "sulfonamide antibacterial"} & got, drug
    risks = {cr.other: cr.risk for cr in T.cross_reactions("amoxicillin")}
    assert risks["penicillin"] == "same class" and risks["cephalosporin"].startswith("low")
    assert "penicillin" in T.cross_reactive("cephalexin")
    assert T.cross_reactive("beta-lactams") >= {"penicillin", "cephalosporin", "carbapenem", "monobactam"}


def test_cross_reactivity_stays_conservative():
    assert "penicillin" not in T.cross_reactive("ciprofloxacin")
    assert "sulfonamide antibacterial" in T.cross_reactive("Bactrim")
    assert "sulfonamide antibacterial" not in T.cross_reactive("hydrochlorothiazide")   # Strom 2003
    assert T.cross_reactive("aztreonam") >= {"ceftazidime"} and "penicillin" not in T.cross_reactive("aztreonam")
    assert T.cross_reactive("warfarin") == frozenset()


def test_class_table_refers_only_to_what_exists():
    epcs = {e for r in rows("drug_classes.tsv") for e in r["epc"].split("|") if e}
    drugs = {r["ingredient"] for r in rows("drug_ingredients.tsv")} | {r["word"] for r in rows("drug_words.tsv")}
    classes = {r["class"] for r in rows("clinical_classes.tsv")}
    for r in rows("clinical_classes.tsv"):
        assert r["note"] and r["words"] and r["allergy"] in ("yes", "no"), r["class"]
        assert T.members_of(r["class"]), r["class"]
        for item in r["members"].split("|") + [x for x in r["exclude"].split("|") if x]:
            if item.startswith("EPC:"):
                assert item[4:] in epcs, (r["class"], item)
            elif item.startswith("class:"):
                assert item[6:] in classes, (r["class"], item)
            else:
                assert item in drugs, (r["class"], item)
    for r in rows("cross_reactivity.tsv"):
        for side in (r["a"], r["b"]):
            assert side in classes or side in drugs, side
        assert r["risk"] and r["note"]


# --- vaccines ----------------------------------------------------------------------------------

def test_shingles_is_the_zoster_group_with_both_vaccines():
    assert T.vaccine_groups("shingles") == {"ZOSTER"} == T.vaccine_groups("shingles shot")
    assert {"187", "121"} <= T.vaccine_codes("shingles")
    assert T.vaccine_groups("187") == T.vaccine_groups("Shingrix") == {"ZOSTER"}
    assert T.vaccine_name("187") == "zoster recombinant" and T.vaccine_name("3") == "MMR"


@pytest.mark.parametrize("words, groups", [
    ("tdap", {"TDAP"}), ("Td booster", {"Td"}), ("flu shot", {"FLU"}), ("influenza", {"FLU"}), ("140", {"FLU"}),
    ("pneumonia shot", {"PneumoPCV", "PneumoPPV"}), ("Prevnar 20", {"PneumoPCV"}), ("pneumovax", {"PneumoPPV"}),
    ("covid booster", {"COVID-19"}), ("gardasil", {"HPV"}), ("hep b", {"HepB"}), ("03", {"MMR"}), ("rsv", {"RSV"}),
])
def test_vaccine_words_reach_cdc_groups(words, groups):
    assert T.vaccine_groups(words) == groups


def test_tetanus_means_every_tetanus_vaccine():
    assert {"TDAP", "Td"} <= T.vaccine_groups("tetanus")


def test_vaccine_shorthand_names_real_cdc_groups():
    cdc = {g for r in rows("cvx.tsv") for g in r["vaccine_groups"].split("|") if g}
    for r in rows("vaccine_shorthand.tsv"):
        assert set(r["groups"].split("|")) <= cdc, r


# --- labs --------------------------------------------------------------------------------------

def test_creatinine_means_every_creatinine_code():
    for word in ("creatinine", "cr", "Cr", "creat"):
        assert {"2160-0", "38483-4", "14682-9"} <= T.lab_codes(word), word
    assert "2161-8" not in T.lab_codes("creatinine")        # urine creatinine is another test


@pytest.mark.parametrize("word, codes", [
    ("egfr", {"33914-3", "62238-1", "98979-8"}), ("GFR", {"33914-3"}), ("a1c", {"4548-4", "17856-6"}),
    ("HbA1c", {"4548-4"}), ("cd4", {"24467-3"}), ("viral load", {"20447-9", "25836-8"}), ("K", {"2823-3", "6298-4"}),
    ("psa", {"2857-1"}), ("ldl", {"18262-6", "13457-7", "2089-1"}), ("bmp", {"51990-0", "2823-3", "2160-0"}),
    ("lfts", {"1742-6", "1920-8", "24325-3"}), ("lipid panel", {"2093-3", "2571-8", "57698-3"}), ("2160-0", {"14682-9"}),
])
def test_lab_words_reach_loinc_codes(word, codes):
    assert codes <= T.lab_codes(word)


def test_lab_groups_and_names():
    assert {"renal function", "bmp", "cmp"} <= T.lab_groups("2160-0")
    assert T.lab_groups("14682-9") == T.lab_groups("2160-0")          # the molar sibling
    assert T.lab_name("4548-4") == "HbA1c" and T.lab_name("14682-9") == "creatinine"
    assert T.lab_group("chem 7") == "bmp" and T.lab_group("LFTs") == "liver function"
    assert T.lab_codes("not a lab") == frozenset()


def test_every_curated_loinc_code_exists_with_the_declared_scale():
    """Against loinc_check.tsv, built from LHNCBC's loinc_unit.json (LOINC 2.67) and the LOINC 2.77
    linguistic variants: every code exists, and its scale is the one labs.tsv declares."""
    check = {r["loinc"]: r for r in rows("loinc_check.tsv")}
    groups = {r["group"] for r in rows("lab_groups.tsv")}
    labs = rows("labs.tsv")
    assert 150 <= len(labs) <= 300
    for r in labs:
        assert r["loinc"] in check, f"{r['loinc']} is not in loinc_check.tsv: rebuild with scripts/build_terminology.py"
        c = check[r["loinc"]]
        assert "yes" in (c["in_loinc_2_67"], c["in_loinc_2_77"]), r["loinc"]
        if c["scale_2_77"]:
            assert c["scale_2_77"] == r["scale"], (r["loinc"], r["scale"], c["scale_2_77"])
        if r["scale"] == "Qn" and c["in_loinc_2_67"] == "yes":
            assert c["units_2_67"], r["loinc"]
        assert set(r["groups"].split("|")) <= groups, r
    for r in rows("lab_groups.tsv"):
        for code in filter(None, r["panels"].split("|")):
            assert code in check and check[code]["scale_2_77"] == "Pan", code


def test_the_answer_layers_short_names_agree_with_the_labs_table():
    vitals = {"85354-9", "55284-4", "8480-6", "8462-4", "8867-4", "9279-1", "8310-5", "8331-1", "59408-5",
              "29463-7", "3141-9", "8302-2", "39156-5", "72514-3"}
    labs = {r["loinc"] for r in rows("labs.tsv")}
    path = REPO / "search" / "answering" / "data" / "short_names.tsv"
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        code, short = line.split("\t")
        if code in vitals:
            continue
        assert code in labs, code
        assert T.lab_name(code) == short, (code, short, T.lab_name(code))


# --- abbreviations -----------------------------------------------------------------------------

def test_abbreviations_read_by_context():
    assert T.abbreviation("BMP", "lab") == ["basic metabolic panel"]
    assert T.abbreviation("BMP")[0] == "basic metabolic panel"
    assert T.abbreviation("K", "lab") == ["potassium"]
    assert T.abbreviation("Tdap") == ["tetanus, diphtheria, and acellular pertussis vaccine"]
    assert T.abbreviation("CA", "problem") == ["cancer"] and T.abbreviation("CA", "lab") == ["calcium"]
    assert T.abbreviation("cr", "lab") == ["creatinine"]
    assert [f.lower() for f in T.abbreviation("HTN")] == ["hypertension"]
    assert "chronic kidney disease" in T.abbreviation("ckd")
    assert T.abbreviation("PCN") == ["penicillin"]
    assert T.abbreviation("qqqx") == []
    with pytest.raises(ValueError):
        T.abbreviation("K", "labs")


def test_abbreviation_overrides_use_known_contexts():
    for r in rows("abbreviation_overrides.tsv"):
        assert r["context"] == "*" or r["context"] in T.CONTEXTS, r
        assert r["long_forms"], r


# --- spelling ----------------------------------------------------------------------------------

@pytest.mark.parametrize("typed, meant", [
    ("retinopahty", "retinopathy"), ("sinusitus", "sinusitis"), ("labetolol", "labetalol"), ("fossamax", "fosamax"),
    ("metforman", "metformin"), ("osteoperosis", "osteoporosis"), ("antipsycotic", "antipsychotic"),
    ("apendectomy", "appendectomy"), ("amoxicilin", "amoxicillin"), ("pnuemonia", "pneumonia"),
])
def test_typos_are_corrected(typed, meant):
    corrected, score = S.correct(typed)
    assert corrected == meant and 0 < score <= 1


@pytest.mark.parametrize("word", [
    "hydroxyzine", "hydralazine", "clonidine", "klonopin", "celebrex", "cerebyx", "zantac", "xanax",
    "metformin", "fosamax", "labetalol", "sinusitis", "retinopathy", "pneumonia", "statins", "tacro",
])
def test_a_known_word_is_never_corrected(word):
    assert S.is_known(word)
    assert S.correct(word) is None


def test_ordinary_short_and_odd_words_are_left_alone():
    for word in ("fitted", "creeping", "stretch", "jumped", "lasx", "fx", "2024", "b12", "k+"):
        assert S.correct(word) is None, word


def test_a_correction_never_lands_on_a_different_drug():
    """For every pair a clinician could confuse, each name is known and stays itself, and a typo of
    one is never corrected to the other."""
    pairs = [("hydroxyzine", "hydralazine"), ("clonidine", "klonopin"), ("celebrex", "cerebyx"), ("zantac", "xanax")]
    for a, b in pairs:
        for typo_of, other in ((a, b), (b, a)):
            for typo in {typo_of[:-1], typo_of[1:] if False else typo_of, typo_of[0] + typo_of[2:]}:
                fixed = S.correct(typo)
                assert fixed is None or fixed[0] != other, (typo, fixed)


def test_vocabulary_holds_every_kind_of_word():
    vocab = set(S.vocabulary())
    assert {"retinopathy", "sinusitis", "labetalol", "fosamax", "metformin", "blood thinner", "shingles",
            "creatinine", "basic metabolic panel", "hypertension"} <= vocab
    assert S.vocabulary() == tuple(sorted(vocab))


# --- provenance --------------------------------------------------------------------------------

def sources_md_checksums() -> dict[str, str]:
    text = (DATA / "SOURCES.md").read_text(encoding="utf-8")
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| `([^`]+)` \| \d+ \| \d+ \| `([0-9a-f]{64})` \|$", text, re.M)}


def test_every_data_file_states_source_and_licence():
    files = {p.name for p in DATA.iterdir()}
    assert files == set(BUILT) | set(HAND) | {"SOURCES.md"}, files ^ (set(BUILT) | set(HAND) | {"SOURCES.md"})
    for name in BUILT:
        raw = (DATA / name).read_bytes()
        head = (gzip.decompress(raw) if name.endswith(".gz") else raw).decode("utf-8")[:4000]
        assert head.startswith("# Source: ") and "Licence: " in head and "do not edit" in head, name
    for name in HAND:
        head = (DATA / name).read_text(encoding="utf-8")[:3000]
        assert "HAND-REVIEWED" in head and "Apache-2.0" in head, name
    md = (DATA / "SOURCES.md").read_text(encoding="utf-8")
    assert md.count("- Licence: ") >= 9 and md.count("- Commit: `") + md.count("- Wheel: `") >= 9
    for name in HAND:
        assert f"`{name}`" in md, name


def test_built_files_match_their_recorded_checksums():
    recorded = sources_md_checksums()
    assert set(recorded) == set(BUILT)
    for name, digest in recorded.items():
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == digest, f"{name} was edited by hand"


def test_the_folder_stays_compact():
    assert sum(p.stat().st_size for p in DATA.iterdir()) < 3_000_000


def test_the_build_says_what_source_is_missing_and_how_to_get_it(tmp_path):
    """The tables are rebuilt on purpose from pinned sources that are not part of the repository
    (two wheels and eight git repositories; `python scripts/build_terminology.py --out DIR` and a
    byte comparison with the committed files, as docs/terminology.md says). Where the
    sources are absent the build stops with exit 2 and a sentence naming the source and the command
    that fetches it; the checksum test above guards the committed files either way."""
    env = {k: v for k, v in os.environ.items() if k != "CHARTCITE_TERMINOLOGY_SOURCES"}
    env["CHARTCITE_TERMINOLOGY_SOURCES"] = str(tmp_path / "no-sources-here")
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "build_terminology.py"), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, cwd=REPO, env=env, encoding="utf-8")
    assert out.returncode == 2 and "no-sources-here" in out.stderr and ("git clone" in out.stderr or "pip download" in out.stderr), \
        out.stderr
