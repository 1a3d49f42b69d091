"""The `chartcite` command line: the contract other tools and the README rely on."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Callable

from .logs import configure_logging, keep_chartcite_logging_in_celery
from .terminal import TerminalSafe, shown, utf8_streams
from .settings import Settings, SettingsError, mask_url_password

log = logging.getLogger("chartcite")


COMMANDS: dict[str, tuple[str, tuple, Callable]] = {}


def command(name: str, help: str, *options: Callable):
    """Register a handler as `chartcite NAME`; its options are declared beside it."""
    def register(handler):
        COMMANDS[name] = (help, options, handler)
        return handler
    return register


def arg(*names: str, **kwargs) -> Callable:
    return lambda parser: parser.add_argument(*names, **kwargs)


def subcommands(dest: str, *commands: tuple[str, str, tuple]) -> Callable:
    """`chartcite keys generate`: (name, help, options) for each subcommand."""
    def add(parser):
        sub = parser.add_subparsers(dest=dest, required=True)
        for name, help, options in commands:
            child = sub.add_parser(name, help=help)
            for option in options:
                option(child)
    return add


JSON = arg("--json", action="store_true", help="machine-readable output")
TENANT = arg("--tenant", help="the tenant (default: CHARTCITE_TENANT)")
PATIENT = arg("--patient", help="the patient's id")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chartcite", description="Cited answers about the patient in context.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help, options, _) in COMMANDS.items():
        child = sub.add_parser(name, help=help)
        for option in options:
            option(child)
    return parser


def main(argv: list[str] | None = None) -> int:
    utf8_streams()
    args = build_parser().parse_args(argv)
    from search.collector import collect_less_often

    collect_less_often()
    try:
        settings = Settings.load()
    except SettingsError as exc:
        print(f"chartcite: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    settings.log_warnings(logging.getLogger("chartcite"))
    settings.apply_tls_trust()
    if args.command in LONG_RUNNING:
        return run(args, settings)
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = TerminalSafe(sys.stdout), TerminalSafe(sys.stderr)
    try:
        return run(args, settings)
    finally:
        sys.stdout, sys.stderr = streams


def run(args, settings: Settings) -> int:
    """The command's handler, its expected failures said in one line with their exit code."""
    if args.command != "config":
        settings.prepare_data_dir()
    handler = COMMANDS[args.command][2]
    from search.backends.base import BackendError
    from search.files import UnsafeFolder
    from search.models.embed import ModelNotFound

    try:
        code = handler(args, settings) or 0
        sys.stdout.flush()          # a closed pipe is met here, not after main returns
        return code
    except BrokenPipeError:
        return reader_went_away()
    except (BackendError, ModelNotFound, SettingsError, FileNotFoundError, UnsafeFolder) as exc:
        print(f"chartcite: {exc}", file=sys.stderr)
        return 2
    except redis_unreachable_errors() as exc:
        print(f"chartcite: Redis at {mask_url_password(settings.redis_url)} cannot be reached ({exc}); start it, or "
              f"correct CHARTCITE_REDIS_URL", file=sys.stderr)
        return EXIT_FAILED


# Commands that hand the process to gunicorn or Celery, which manage their own streams.
LONG_RUNNING = {"serve", "worker", "beat"}


def reader_went_away() -> int:
    """`chartcite patients --json | head`: the reader stopped reading, which is not an error of
    chartcite's. What remains to be written goes nowhere (Python would otherwise report the closed
    pipe again when it flushes at exit), and the exit code is the one a shell gives a process the
    closed pipe stopped (128 + SIGPIPE)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_CLOSED_PIPE


def redis_unreachable_errors() -> tuple[type[Exception], ...]:
    """What Redis (job progress, the EHR request budget) and Celery's broker connection raise when
    the server is down or unreachable: a command says so in a sentence, not a traceback."""
    from kombu.exceptions import OperationalError
    from redis.exceptions import ConnectionError, TimeoutError

    return ConnectionError, TimeoutError, OperationalError


def service(settings: Settings):
    from search.service import SearchService

    return SearchService(**settings.search_options())


@command("config", "print the effective settings (secrets masked)")
def cmd_config(args, settings: Settings) -> int:
    print(json.dumps(settings.masked(), indent=2))
    return 0


# Exit codes of `chartcite index` (and of `check`): their meanings are in docs/commands.md, which
# scripts/command_reference.py writes from these constants.
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SKIPPED, EXIT_HELD_BACK = 0, 1, 2, 3, 4
ALLOW_REMOVALS = arg("--allow-removals", action="store_true",
                     help="carry out removals over the removal budget (CHARTCITE_MAX_REMOVAL_SHARE of a patient's "
                          "held record); without it they are held back, reported, and the exit status is 4")
EXIT_CLOSED_PIPE = 141


@command("index", "index FHIR bundles / NDJSON files or folders",
         arg("paths", nargs="+", help="FHIR R4 Bundles (.json, .json.gz), Bulk Data NDJSON files, or folders of these"),
         TENANT, ALLOW_REMOVALS)
def cmd_index(args, settings: Settings) -> int:
    from tqdm import tqdm

    tenant = args.tenant or settings.tenant
    for path in args.paths:
        if not Path(path).exists():
            raise FileNotFoundError(f"no such file or directory: {path}")
    started = time.perf_counter()
    svc = service(settings)
    svc.embedder  # load the model before the bar starts
    bar = tqdm(unit="patient", desc="indexing", file=sys.stderr)

    def on_patient(done, total):
        bar.total = total
        bar.update(done - bar.n)

    summary = svc.index_paths(tenant, args.paths, on_patient, args.allow_removals)
    bar.close()
    print(format_index_summary(summary, time.perf_counter() - started))
    if summary.load.held_back:
        return EXIT_HELD_BACK
    skipped = summary.load.skipped or summary.result.problems
    return EXIT_SKIPPED if skipped else EXIT_OK


def format_index_summary(summary, elapsed: float) -> str:
    report, total = summary.load, summary.result
    rows = report.type_rows()     # read counts skipped ones too, so they add up to resources_read
    by_read = sorted(rows, key=lambda row: (-row[1], row[0]))
    lines = [f"resources read: {report.resources_read}  ({', '.join(f'{rt} {read}' for rt, read, *_ in by_read)})",
             f"  {'type':28} {'read':>7} {'skipped':>8}  what became of it"]
    lines += [f"  {shown(rt):28} {read:>7} {skipped:>8}  {shown(fate)}" for rt, read, skipped, _, fate in rows]
    lines.append(f"patients: {total.patients}  chunks written: {total.embedded}  unchanged: {total.unchanged}  "
                 f"removed: {total.removed}  total chunks: {total.chunks}  in {elapsed:.1f}s")
    if report.added_to:
        lines.append(f"added to the records held (this input is not their whole record, so nothing of theirs was "
                     f"removed): {len(report.added_to)} patient(s): {', '.join(map(shown, report.added_to[:20]))}"
                     + (" ..." if len(report.added_to) > 20 else ""))
    lines += removal_lines(report)
    lines.append(f"skipped: {len(report.skipped) + len(total.problems)}")
    lines += [f"  {shown(s.origin)}: {shown(s.reason)}" for s in report.skipped]
    lines += [f"  {shown(p.ref)}: {shown(p.reason)}" for p in total.problems]
    if report.warnings:
        lines.append(f"warnings: {len(report.warnings)} (indexed)")
        lines += [f"  {shown(w.origin)}: {shown(w.reason)}" for w in report.warnings]
    return "\n".join(lines)


def removal_lines(report) -> list[str]:
    """Why what an input lacks was not removed, one line per patient, and the removals held back."""
    lines = []
    if report.not_removed:
        lines.append(f"not removed: {len(report.not_removed)}")
        lines += [f"  {s.origin}: {s.reason}" for s in report.not_removed]
    if report.held_back:
        lines.append(f"HELD BACK (over the removal budget): {len(report.held_back)}")
        lines += [f"  {s.origin}: {s.reason}" for s in report.held_back]
    return lines


@command("check", "verify the index is consistent (chunks, lexical rows, vectors, patient summaries, similarity profiles)", TENANT,
         arg("--repair", action="store_true",
             help="first mend the similarity profiles from the indexed records (build the missing and another "
                  "model's, remove those of patients no longer held) and remove sentence readings of chunks no "
                  "longer held; nothing else is changed"), JSON)
def cmd_check(args, settings: Settings) -> int:
    tenant = args.tenant or settings.tenant
    svc = service(settings)
    repaired = svc.repair_profiles(tenant) if args.repair else None
    pruned = svc.catalog.prune_readings(tenant) if args.repair else None
    result, held_back = svc.catalog.check(tenant), svc.held_back.listed(tenant)
    if args.json:
        print(json.dumps({"tenant": tenant, "counts": result.counts, "problems": result.problems,
                          "warnings": result.warnings, "held_back": held_back,
                          **({"repaired": repaired, "readings_removed": pruned} if repaired is not None else {})},
                         indent=2))
    else:
        if repaired is not None:
            print(f"repaired: {repaired['built']} similarity profiles built, {repaired['removed']} removed")
        if pruned:
            print(f"repaired: {pruned} sentence readings of chunks no longer held removed")
        print(f"tenant {tenant}: " + ", ".join(f"{name} {n}" for name, n in result.counts.items()))
        print("consistent" if not result.problems else "INCONSISTENT:")
        print("\n".join(f"  {shown(p)}" for p in result.problems))
        for warning in result.warnings:
            print(f"warning: {shown(warning)}")
        if held_back:
            print(f"removals held back (over the removal budget; run the input again with --allow-removals to "
                  f"carry one out): {len(held_back)}")
            print("\n".join(f"  {shown(line)}" for line in held_back))
    return EXIT_FAILED if result.problems else EXIT_OK


@command("patients", "list indexed patients (no names unless --show-names)", TENANT,
         arg("--show-names", action="store_true", help="also print each patient's name"), JSON)
def cmd_patients(args, settings: Settings) -> int:
    rows = service(settings).patients(args.tenant or settings.tenant)
    if args.json:
        for row in rows:
            if not args.show_names:
                row.pop("name", None)
            print(json.dumps(row))
        return 0
    header = f"{'patient_id':38} {'age':>4} {'sex':7} {'resources':>9} {'chunks':>7}" + ("  name" if args.show_names else "")
    print(header)
    for row in rows:
        line = (f"{shown(row['patient_id']):38} {row.get('age') if row.get('age') is not None else '?':>4} "
                f"{shown(row.get('gender', '')):7} {sum(row.get('resource_counts', {}).values()):>9} "
                f"{sum(row.get('chunk_counts', {}).values()):>7}")
        print(line + (f"  {shown(row.get('name', ''))}" if args.show_names else ""))
    return 0


@command("context", "the structured context bundle of one patient (problems, meds, labs...)",
         arg("--patient", required=True, help="the patient's id"), TENANT, JSON)
def cmd_context(args, settings: Settings) -> int:
    tenant = args.tenant or settings.tenant
    svc = service(settings)
    if svc.patient(tenant, args.patient) is None:
        print(f"chartcite: patient {args.patient} is not indexed in tenant {tenant}", file=sys.stderr)
        return 1
    bundle = svc.context(tenant, args.patient, similar=not similar_refused(settings, tenant))
    if args.json:
        print(json.dumps(bundle, indent=2))
        return 0
    print(format_context(bundle))
    return 0


def similar_refused(settings: Settings, tenant: str) -> str:
    from .similar_access import refusal

    return refusal(settings, registry_for(settings) if settings.similar_patients else None, tenant)


def audit_cli_use(settings: Settings, kind: str, tenant: str, patient_id: str, **data) -> None:
    """Every use is audited: the clinician (here the OS account) and the current patient, never the others."""
    import getpass

    from .audit import open_audit

    open_audit(settings.audit_db).record(kind, tenant, f"cli:{getpass.getuser()}", patient_id, **data)


@command("similar", "the most similar patients of the same tenant, de-identified (opt-in: CHARTCITE_SIMILAR_PATIENTS)",
         arg("--patient", required=True, help="the patient's id"), TENANT,
         arg("--k", type=int, default=5, help="how many similar patients (1-20)"), JSON)
def cmd_similar(args, settings: Settings) -> int:
    tenant = args.tenant or settings.tenant
    refused = similar_refused(settings, tenant)
    if refused:
        print(f"chartcite: {refused}", file=sys.stderr)
        return 2
    if not 1 <= args.k <= 20:
        print("chartcite: --k must be between 1 and 20", file=sys.stderr)
        return 2
    svc = service(settings)
    if svc.patient(tenant, args.patient) is None:
        print(f"chartcite: patient {args.patient} is not indexed in tenant {tenant}", file=sys.stderr)
        return 1
    result = svc.similar(tenant, args.patient, args.k)
    audit_cli_use(settings, "similar", tenant, args.patient, k=args.k, found=len(result["similar"]))
    print(json.dumps(result, indent=2) if args.json else format_similar(result))
    return 0


def format_similar(result: dict) -> str:
    lines = [result["message"], result["source"]]
    for n, peer in enumerate(result["similar"], start=1):
        lines.append(f"{n}. similarity {peer['similarity']:.2f} · {peer['sex']}, aged {peer['age_band']}")
        lines += [f"   shares {item}" for item in peer["shared"]]
        lines += [f"   then: {item}" for item in peer["followed"]]
    return "\n".join(lines)


@command("cohort", "compare an outcome after exposures among the tenant's patients with a condition, aggregates only "
                   "(opt-in: CHARTCITE_SIMILAR_PATIENTS)",
         arg("--condition", required=True, help="the condition, as a clinician says it (hypertension)"),
         arg("--exposure", action="append", required=True, help="a drug or class of one group (repeat: losartan, "
                                                                  "lisinopril)"),
         arg("--outcome", required=True, help="the measure followed (systolic BP, HbA1c, LDL, eGFR)"),
         arg("--window-months", type=int, default=12, help="the change is read this long after the exposure started"),
         arg("--min-group", type=int, default=11, help="groups with fewer patients are suppressed (at least 11)"),
         arg("--patient", help="the patient in context, for the audit trail"), TENANT, JSON)
def cmd_cohort(args, settings: Settings) -> int:
    from search.similar.cohort import MINIMUM_GROUP, CohortError, Comparison

    tenant = args.tenant or settings.tenant
    refused = similar_refused(settings, tenant)
    if refused:
        print(f"chartcite: {refused}", file=sys.stderr)
        return 2
    if len(args.exposure) < 2 or args.min_group < MINIMUM_GROUP or not 1 <= args.window_months <= 120:
        print(f"chartcite: give two or more --exposure groups, --min-group of at least {MINIMUM_GROUP} and "
              "--window-months from 1 to 120", file=sys.stderr)
        return 2
    asked = Comparison(args.condition, tuple(args.exposure), args.outcome, args.window_months, args.min_group)
    try:
        result = service(settings).cohort(tenant, asked)
    except CohortError as exc:
        print(f"chartcite: {exc}", file=sys.stderr)
        return 2
    audit_cli_use(settings, "cohort", tenant, args.patient or "", condition=args.condition, exposures=args.exposure,
                  outcome=args.outcome)
    print(json.dumps(result, indent=2) if args.json else format_cohort(result))
    return 0


def format_cohort(result: dict) -> str:
    lines = [f"{result['outcome']} change within {result['window_months']} months after each exposure started, "
             f"patients with {result['condition']}:"]
    for group in result["groups"]:
        if group["median_change"] is None:
            lines.append(f"  {group['exposure']}: " + (f"{group['patients']} patients; " if group["patients"] else "")
                         + group["note"])
        else:
            lines.append(f"  {group['exposure']}: {group['patients']} patients, {group['with_measure']} with readings "
                         f"before and after, median change {group['median_change']:+g} {result['unit']}".rstrip())
    if result["left_out"]:
        lines.append(f"  {result['left_out']}")
    lines.append(result["statement"])
    return "\n".join(lines)


def format_context(bundle: dict) -> str:
    lines = []
    show = {
        "problems": lambda i: f"{i['name']} (since {i['since'] or '?'})",
        "medications": lambda i: f"{i['name']}" + (f" — {i['dose']}" if i["dose"] else "") + (f" (for {i['reason']})" if i["reason"] else ""),
        "allergies": lambda i: i["name"] + (f" — {', '.join(i['reactions'])}" if i["reactions"] else "")
        + (f" [{i['criticality']}]" if i["criticality"] else ""),
        "labs": lambda i: f"{i['name']}: {i['value']} on {i['date']}" + (f" [{i['flag']}]" if i["flag"] else ""),
        "vitals": lambda i: f"{i['name']}: {i['value']} on {i['date']}",
        "encounters": lambda i: f"{i['date']} {i['type'] or i['class']}" + (f" — {i['reason']}" if i["reason"] else ""),
    }
    for key, render in show.items():
        lines.append(f"{key.upper()} ({len(bundle[key])})")
        lines += [f"  {shown(render(item))}  [{shown(item['ref'])}]" for item in bundle[key]] or ["  none recorded"]
    return "\n".join(lines)


def iso_day(text: str):
    """A YYYY-MM-DD argument as a date, or a clear error."""
    from datetime import date

    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date (YYYY-MM-DD)") from None


@command("ask", "ask a question about one patient (or --batch a JSONL file)",
         arg("question", nargs="?", help="the question, in plain language (with --patient)"), PATIENT,
         arg("--batch", help="JSONL with patient_id and question (and id) per line"), TENANT,
         arg("--k", type=int, default=5, help="evidence passages the answer may cite"),
         arg("--pipeline", choices=("dense", "hybrid", "full"), default="full",
             help="dense: kNN only (the baseline); hybrid: BM25 over concept-normalised text and dense, fused; full: "
                  "hybrid with query expansion, filter, recovery and a deterministic rerank"), JSON,
         arg("--explain", action="store_true", help="print the question plan and the per-stage table"),
         arg("--today", type=iso_day, default=None,
             help="the day 'since last month' counts from (YYYY-MM-DD; default: today)"))
def cmd_ask(args, settings: Settings) -> int:
    tenant = args.tenant or settings.tenant
    svc = service(settings)
    if args.batch:
        return ask_batch(svc, tenant, args)
    if not args.patient or not args.question:
        print("chartcite ask: give --patient ID and a QUESTION, or --batch FILE", file=sys.stderr)
        return 2
    result = svc.ask(tenant, args.patient, args.question, k=args.k, pipeline=args.pipeline, today=args.today)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        if result.get("banner"):
            print(result["banner"])
        print(result["answer"])
        print(f"\nconfidence: {result['confidence']}")
        for c in result["citations"]:
            print(f"  [{c['n']}] {shown(c['label'])}  ({shown(c['ref'])})")
    if args.explain:
        print_plan(result["diagnostics"])
        print_stage_table(result["diagnostics"]["stages"])
    return 0


def print_plan(diagnostics: dict) -> None:
    """How the question was read: each part's concepts with their role and source, corrections,
    the window, what the record holds in no form; then each part's operation, target and window."""
    parts = diagnostics.get("parts") or [{"part": "", "analysis": diagnostics.get("analysis"),
                                          "question_plan": diagnostics.get("question_plan")}]
    for part in parts:
        print_operations(part.get("question_plan") or (part.get("diagnostics") or {}).get("question_plan"))
        analysis = part.get("analysis") or {}
        plan = analysis.get("plan") or {}
        print(f"\nplan{' of “' + part['part'] + '”' if part.get('part') else ''}:")
        for c in plan.get("concepts", []):
            via = f" via {c['via']}" if c.get("via") else ""
            print(f"  {c['role']:8} {c['concept']} ({c['type']}) from “{c['from']}”{via}")
        for label, value in (("corrections", ", ".join(analysis.get("corrections") or [])),
                             ("window", " to ".join(d or "…" for d in (analysis.get("date_from"), analysis.get("date_to")))
                              if analysis.get("date_from") or analysis.get("date_to") else ""),
                             ("intents", ", ".join(analysis.get("intents") or [])),
                             ("absent", ", ".join(plan.get("absent") or []))):
            if value:
                print(f"  {label}: {value}")


def print_operations(plan: dict | None) -> None:
    """The question plan (search/answering/plan.py): per part, its operation, target and window."""
    if not plan:
        return
    print(f"\nquestion plan (today {plan['today']}):")
    for part in plan.get("parts") or []:
        target, window = part["target"], part["window"]
        span = " to ".join(d or "…" for d in (window["start"], window["end"])) if window["start"] or window["end"] else "all time"
        print(f"  {part['operation']:8} {target['kind']}: {target['words']}  window: {span}"
              + (f" ({window['source']}: {window['words']})" if window["words"] else ""))
        if part.get("compare_with"):
            print(f"  {'':8} against {part['compare_with']['words']}")
    if not plan.get("parts"):
        print("  no target to operate on: answered from what the retrieval found")


def ask_batch(svc, tenant: str, args) -> int:
    """One JSON result per line, in order; a line that cannot be answered gets an error result and
    the rest are still answered. Exit 3 when any line failed."""
    failed = 0
    with open(args.batch, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            result = answer_line(svc, tenant, args, line, f"{args.batch}:{lineno}")
            failed += "error" in result
            print(json.dumps(result), flush=True)
    return EXIT_SKIPPED if failed else EXIT_OK


def answer_line(svc, tenant: str, args, line: str, where: str) -> dict:
    try:
        item = json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        return {"line": where, "error": "not a JSON object"}
    if not isinstance(item, dict) or not isinstance(item.get("patient_id"), str) \
            or not isinstance(item.get("question"), str) or not item["question"].strip():
        return {"line": where, "error": "needs patient_id and question (strings)"}
    qid = item.get("id") if isinstance(item.get("id"), (str, int)) else None
    try:
        return svc.ask(tenant, item["patient_id"], item["question"], k=args.k, pipeline=args.pipeline, question_id=qid)
    except Exception as exc:  # one question's failure must not cost the questions after it
        log.exception("a batch question could not be answered")
        return {"line": where, "id": qid, "patient_id": item["patient_id"],
                "error": f"could not be answered ({type(exc).__name__})"}


def print_stage_table(stages: list[dict]) -> None:
    print(f"\n{'stage':10} {'in':>7} {'out':>7} {'corpus':>8} {'ms':>9}  note")
    for s in stages:
        print(f"{s['name']:10} {s['in']:>7} {s['out']:>7} {s['corpus_ratio']:>8.3f} {s['ms']:>9.2f}  {s.get('note', '')}")


@command("eval", "recall@k, MRR, facts and abstention per question set (one or more files)",
         arg("questions", nargs="+", help="question sets (JSON lines with gold evidence groups)"),
         arg("--k", default="3,5,10", help="cut-offs of recall@k, comma separated; answers use the deepest"),
         arg("--pipeline", default="dense,hybrid,full", help="pipelines to compare, comma separated"),
         arg("--ablate", default="", help="also run full without these stages: filter,recovery,rerank,series"),
         arg("--backend", choices=("embedded", "elasticsearch"), help="overrides CHARTCITE_BACKEND"), TENANT, JSON,
         arg("--stages", action="store_true", help="also recall@k after every stage of full (first k)"),
         arg("--mode", choices=("answer", "reply"), default="answer",
             help="reply: reply drafts to patient messages (evidence-sentence P/R/F1, facts, words, uncited)"))
def cmd_eval(args, settings: Settings) -> int:
    from search.evaluate import evaluate, format_table, recall_after_stages

    if args.mode == "reply":
        return eval_replies(args, settings)
    ks = [int(k) for k in args.k.split(",")]
    pipelines = [p for p in args.pipeline.split(",") if p]
    ablate = [a for a in args.ablate.split(",") if a]
    from search.retrieval.pipeline import ABLATABLE

    unknown = sorted(set(ablate) - set(ABLATABLE))
    if unknown:
        print(f"chartcite: cannot ablate {', '.join(unknown)}; choose from {', '.join(ABLATABLE)}", file=sys.stderr)
        return 2
    if args.backend:
        settings.backend = args.backend
    svc = service(settings)
    tenant = args.tenant or settings.tenant
    reports = {path: evaluate(svc, tenant, path, ks, pipelines, ablate) for path in args.questions}
    if args.stages:
        for path, report in reports.items():
            report["recall_after_stage"] = {"k": ks[0], "full": recall_after_stages(svc, tenant, path, ks[0])}
    if args.json:
        print(json.dumps(reports[args.questions[0]] if len(reports) == 1 else reports, indent=2))
        return 0
    print("\n\n".join(f"== {path}\n{format_table(report, ks)}" for path, report in reports.items()))
    for path, report in reports.items():
        if "recall_after_stage" in report:
            after = report["recall_after_stage"]
            print(f"\nrecall@{after['k']} after each stage of full ({path}): "
                  + ", ".join(f"{stage} {value:.3f}" for stage, value in after["full"].items()))
    return 0


def eval_replies(args, settings: Settings) -> int:
    from search.reply.evaluate import evaluate_replies, format_summary

    if args.backend:
        settings.backend = args.backend
    report = evaluate_replies(service(settings), args.tenant or settings.tenant, args.questions, settings.reply_words)
    print(json.dumps(report, indent=2) if args.json else format_summary(report))
    return 0


@command("reply", "draft a reply to a patient's portal message: every sentence cites its evidence; never sent",
         PATIENT, TENANT, JSON,
         arg("--message-file", required=True, help="the message, as plain text ('-' reads standard input)"))
def cmd_reply(args, settings: Settings) -> int:
    if not args.patient:
        print("chartcite reply: give --patient ID", file=sys.stderr)
        return 2
    message = read_message(args.message_file)
    if not message.strip():
        print("chartcite reply: the message is empty", file=sys.stderr)
        return 2
    result = service(settings).reply(args.tenant or settings.tenant, args.patient, message,
                                     settings.reply_urgent_text, settings.reply_words)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    if result["urgent"]:
        print(f"URGENT: the message describes {', '.join(result['urgent_signs'])}")
    print("DRAFT (not sent; copy it into your reply):")
    print(result["draft"])
    print("\nevidence:")
    for e in result["evidence"]:
        print(f"  [{e['n']}] {e['score']:.2f}  {shown(e['ref'])}  {shown(e['text'])}")
    for q in result["unanswered"]:
        print(f"unanswered: {shown(q)}")
    return 0


def read_message(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read(20000)


@command("serve", "serve the web app (gunicorn; --dev for Flask's development server)",
         arg("--host", default="127.0.0.1", help="address to listen on"),
         arg("--port", type=int, default=5000, help="port to listen on"),
         arg("--cert", help="TLS certificate (PEM) for a local HTTPS test; production sits behind a TLS proxy"),
         arg("--key", help="TLS private key (PEM) matching --cert"),
         arg("--dev", action="store_true", help="Flask's development server (one process, for local work) instead of gunicorn"))
def cmd_serve(args, settings: Settings) -> int:
    from .app import create_app

    if bool(args.cert) != bool(args.key):
        raise SettingsError("--cert and --key go together")
    scheme = "https" if args.cert else "http"
    print(f"chartcite is serving on {scheme}://{args.host}:{args.port}/  (Ctrl-C to stop)", flush=True)
    if args.dev:
        create_app(settings).run(host=args.host, port=args.port, threaded=True, use_reloader=False,
                                 ssl_context=(args.cert, args.key) if args.cert else None)
        return 0
    from .server import serve

    serve(settings, args.host, args.port, args.cert, args.key)
    return 0


def registry_for(settings: Settings):
    from workers.sync import open_registry

    return open_registry(settings)


@command("keys", "chartcite's signing keys (the JWKS EHRs verify its assertions with)", subcommands(
    "keys_command",
    ("generate", "new current key pairs; older ones stay published for the overlap",
     (arg("--alg", choices=("RS384", "ES384", "both"), default="both", help="which key pairs to make"),)),
    ("list", "the keys and whether they are retiring", ()),
    ("prune", "drop retired keys whose overlap has passed", ())))
def cmd_keys(args, settings: Settings) -> int:
    from fhir_ingest.connection.keys import generate_pair

    registry = registry_for(settings)
    if args.keys_command == "generate":
        overlap = settings.key_overlap_days * 86400
        for alg in (("RS384", "ES384") if args.alg == "both" else (args.alg,)):
            pair = generate_pair(alg)
            registry.add_key(pair, overlap)
            print(f"{alg} key {pair.kid} is now current; earlier {alg} keys stay in the JWKS for "
                  f"{settings.key_overlap_days} days")
    elif args.keys_command == "prune":
        print(f"removed {registry.prune_keys()} retired keys")
    for row in registry.key_rows():
        state = "current" if not row["retire_after"] else f"retiring {time.strftime('%Y-%m-%d', time.gmtime(row['retire_after']))}"
        print(f"  {row['alg']}  {row['kid']}  {state}")
    return 0


def add_client_options(parser, defaults: bool) -> None:
    from fhir_ingest.connection.client_types import CLIENT_AUTH_METHODS, DEFAULT_REQUEST_SCOPES

    parser.add_argument("--client-auth", choices=CLIENT_AUTH_METHODS, default="private_key_jwt" if defaults else None,
                        help="how chartcite signs in at the token endpoint: private_key_jwt (confidential asymmetric, "
                             "the default), client_secret_basic (confidential symmetric) or none (public client)")
    parser.add_argument("--client-secret-env", metavar="VARIABLE",
                        help="name of the environment variable holding the client secret (client_secret_basic); "
                             "a secret on the command line would show in the process list")
    parser.add_argument("--secret-encoding", choices=("form", "raw"), default="form" if defaults else None,
                        help="how the client secret goes into HTTP Basic: form-urlencoded first, as RFC 6749 says "
                             "(the default), or raw, as many servers compare it; `chartcite ehr check` finds which")
    parser.add_argument("--request-scopes", default=DEFAULT_REQUEST_SCOPES if defaults else None,
                        help=f"identity and refresh scopes to ask for (default {DEFAULT_REQUEST_SCOPES!r}); the "
                             "resource scopes follow from --scopes")


def add_backend_options(parser, defaults: bool) -> None:
    """The Backend Services side of a registration (background sync), for add and update."""
    parser.add_argument("--backend-client-id", default=None,
                        help="the client id of the EHR's separate Backend Services app (Epic's \"Backend Systems\" "
                             "registration); by default background sync signs in as --client-id")
    parser.add_argument("--backend-client-secret-env", metavar="VARIABLE",
                        help="name of the environment variable holding that app's client secret, when it signs in "
                             "with one (Oracle Health system accounts); without it, it signs with chartcite's key")
    parser.add_argument("--backend-only", default=False if defaults else None,
                        action="store_true" if defaults else argparse.BooleanOptionalAction,
                        help="a registration for background sync only: no clinician launches from it, so its EHR "
                             "needs no authorization endpoint")
    parser.add_argument("--bulk-types", default=None,
                        help="the resource types a Bulk round exports, comma separated (Patient is always added); "
                             "'auto' (the default): every kind chartcite reads that the EHR's CapabilityStatement "
                             "offers")


def client_secret_from(args, option: str = "client_secret_env") -> str:
    from fhir_ingest.connection.registry import RegistryError

    variable = getattr(args, option)
    if not variable:
        return ""
    secret = os.environ.get(variable, "")
    if not secret:
        raise RegistryError(f"the variable {variable} named by --{option.replace('_', '-')} is empty or unset")
    return secret


def backend_changes(args) -> dict:
    return {"backend_client_id": args.backend_client_id, "backend_only": args.backend_only,
            "backend_client_secret": client_secret_from(args, "backend_client_secret_env") or None,
            "bulk_types": args.bulk_types}


@command("ehr", "register EHRs (each one is a tenant)", subcommands(
    "ehr_command",
    ("add", "register an EHR", (
        arg("--name", required=True, help="short name; becomes the tenant"),
        arg("--iss", required=True, help="the EHR's FHIR base URL (the iss of its launches)"),
        arg("--client-id", required=True, help="the client id the EHR gave chartcite"),
        arg("--scopes", choices=("v1", "v2"), default="v2", help="SMART scope syntax the EHR expects"),
        arg("--frame-origin", action="append", default=[], help="origin that embeds chartcite (repeatable)"),
        arg("--group-id", default="", help="Bulk Data Group for background sync"),
        arg("--write-back", action="store_true", help="also ask for DocumentReference create, so saved drafts can "
            "be written back as preliminary notes"),
        lambda parser: add_client_options(parser, defaults=True),
        lambda parser: add_backend_options(parser, defaults=True))),
    ("update", "change a registration (iss, client type, secret, scopes, frames, group, Backend Services client "
               "and types); what is not given stays", (
        arg("name", help="the registered EHR's name"),
        arg("--iss", help="the EHR's FHIR base URL, when it moved (launches from the old one are refused)"),
        arg("--client-id", help="the client id the EHR gave chartcite"),
        arg("--scopes", choices=("v1", "v2"), help="SMART scope syntax the EHR expects"),
        arg("--frame-origin", action="append", default=None, help="replaces the frame origins (repeatable)"),
        arg("--group-id", help="Bulk Data Group for background sync"),
        arg("--write-back", action=argparse.BooleanOptionalAction, default=None,
            help="ask (or stop asking) for DocumentReference create"),
        arg("--similar-patients", choices=("on", "off"), default=None,
            help="similar patients and cohort comparisons over this EHR's tenant (also needs "
                 "CHARTCITE_SIMILAR_PATIENTS=on)"),
        lambda parser: add_client_options(parser, defaults=False),
        lambda parser: add_backend_options(parser, defaults=False))),
    ("list", "registered EHRs and their last sync", (JSON,)),
    ("remove", "unregister an EHR (its index is kept)", (arg("name", help="the registered EHR's name"),)),
    ("check", "is the registration ready? discovery, capabilities, JWKS, Backend Services token, one search; "
              "each failure with its fix", (arg("name", help="the registered EHR's name"), JSON))))
def cmd_ehr(args, settings: Settings) -> int:
    from fhir_ingest.connection.registry import RegistryError

    registry = registry_for(settings)
    try:
        if args.ehr_command == "add":
            ehr = registry.add_ehr(args.name, args.iss, args.client_id, args.scopes, args.frame_origin, args.group_id,
                                   args.write_back, args.client_auth, client_secret_from(args), args.request_scopes,
                                   args.secret_encoding, **backend_changes(args))
            print(f"registered {ehr.name}: launches from {ehr.iss} are accepted; tenant {ehr.name}; "
                  f"client {ehr.auth_method}; asks for {ehr.request_scopes}")
            if not registry.current_key():
                print("no signing key yet: run `chartcite keys generate` (private_key_jwt sign-in and Backend Services "
                      "sync need it)")
            return 0
        if args.ehr_command == "update":
            ehr = registry.update_ehr(args.name, iss=args.iss, client_id=args.client_id, scopes=args.scopes,
                                      frame_origins=args.frame_origin, group_id=args.group_id,
                                      write_back=args.write_back, client_auth=args.client_auth,
                                      similar_patients=None if args.similar_patients is None
                                      else args.similar_patients == "on",
                                      client_secret=client_secret_from(args) or None,
                                      request_scopes=args.request_scopes, secret_encoding=args.secret_encoding,
                                      **backend_changes(args))
            print(f"updated {ehr.name}: client {ehr.auth_method}; asks for {ehr.request_scopes}")
            return 0
        if args.ehr_command == "check":
            return check_ehr(args, settings, registry)
        if args.ehr_command == "remove":
            return remove_ehr(settings, registry, args.name)
    except RegistryError as exc:
        print(f"chartcite: {exc}", file=sys.stderr)
        return 2
    return list_ehrs(args, settings, registry)


def list_ehrs(args, settings: Settings, registry) -> int:
    from workers.bulk_round import group_cursors

    rows = [e.to_dict() | {"patient_syncs": registry.patient_sync_summary(e.name),
                           "bulk_cursors": group_cursors(settings, registry, e.name)} for e in registry.ehrs()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for e in rows:
        cursors = ", ".join(f"{group} from {c['since'] or '-'}" + (f" (round {c['open_round']})" if c["open_round"] else "")
                            for group, c in e["bulk_cursors"].items()) or "-"
        print(f"{e['name']}  iss={e['iss']}  client={e['client_id']} ({e['client_auth']})  scopes={e['scopes']} "
              f"+ {' '.join(e['request_scopes']) or '-'}  "
              f"frames={' '.join(e['frame_origins']) or '-'}  group={e['group_id'] or '-'}  "
              f"last bulk sync {when(e['last_sync_at'])}: {e['last_sync_status']}  bulk cursors: {cursors}  "
              f"patients synced by launches: {e['patient_syncs']['patients']}, last {when(e['patient_syncs']['last'])}")
        for group, c in e["bulk_cursors"].items():
            for item in c["last_skipped"]:
                print(f"  skipped in the last round of group {group}: {item}")
    if not rows:
        print("no EHR registered: chartcite ehr add --name ... --iss ... --client-id ...")
    return 0


def remove_ehr(settings: Settings, registry, name: str) -> int:
    from workers.bulk_round import forget_registration

    if not registry.remove_ehr(name):
        print(f"chartcite: no EHR named {name}", file=sys.stderr)
        return 1
    forget_registration(settings, registry, name)
    print(f"removed {name}; launches from it are now refused, and its Bulk rounds and cursors are gone")
    return 0


def when(timestamp: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(timestamp)) if timestamp else "never"


def check_ehr(args, settings: Settings, registry) -> int:
    from .ehr_check import EhrChecker, format_checks
    from workers.sync import ehr_client

    ehr = registry.ehr(args.name)
    if ehr is None:
        print(f"chartcite: no EHR named {args.name} (chartcite ehr list)", file=sys.stderr)
        return 2
    if not settings.public_url:
        print("note: CHARTCITE_PUBLIC_URL is not set; checking the JWKS at http://127.0.0.1:5000", file=sys.stderr)
    checker = EhrChecker(registry, ehr, settings.public_url or "http://127.0.0.1:5000",
                         lambda checked, auth: ehr_client(settings, registry, checked, auth=auth))
    checks = checker.run()
    print(json.dumps([c.to_dict() for c in checks], indent=2) if args.json else format_checks(checks))
    return 1 if any(c.status == "fail" for c in checks) else 0


@command("audit", "the audit trail: who asked what about which patient (JSON lines with --jsonl)",
         arg("--patient", default="", help="only this patient's entries"),
         arg("--tenant", default="", help="only this tenant's entries"),
         arg("--kind", default="", help="only entries of this kind: ask, refused, draft, draft-saved, "
             "draft-written, session-ended, admin, similar, cohort"), arg("--limit", type=int, default=50, help="the newest N entries"),
         arg("--jsonl", action="store_true", help="export as JSON lines, oldest first"))
def cmd_audit(args, settings: Settings) -> int:
    from .audit import open_audit

    settings.prepare_data_dir()
    entries = open_audit(settings.audit_db).entries(limit=args.limit, kind=args.kind, patient_id=args.patient,
                                                    tenant=args.tenant)
    if args.jsonl:
        for entry in reversed(entries):
            print(json.dumps(entry))
        return 0
    for e in entries:
        detail = e.get("answer") or e.get("reason") or e.get("kind")
        print(f"{e['when']}  {shown(e['kind']):12} {shown(e['tenant']):12} {shown(e['clinician'][-40:]):40} "
              f"patient={shown(e['patient_id'])}  q={shown(repr(e['question'][:60]))}  cites={len(e.get('citations', []))}  "
              f"removed={e.get('removed_statements', 0)}  {shown(str(detail)[:60])}")
    if not entries:
        print("no audit entries match")
    return 0


@command("registration-info", "what the Epic / Oracle Health consoles ask for", JSON)
def cmd_registration_info(args, settings: Settings) -> int:
    from .registration import format_info, registration_info

    if not settings.public_url:
        print("note: CHARTCITE_PUBLIC_URL is not set; showing http://127.0.0.1:5000", file=sys.stderr)
    info = registration_info(settings.public_url or "http://127.0.0.1:5000", registry_for(settings))
    print(json.dumps(info, indent=2) if args.json else format_info(info))
    return 0


@command("sync", "Backend Services + Bulk Data sync of a registered EHR's group, now",
         arg("--tenant", required=True, help="the registered EHR's name"),
         arg("--group", default="", help="Group id to export (default: the registration's); each group keeps its own "
             "cursor, and a group's first round is a full one"),
         arg("--full", action="store_true", help="export everything, not just what changed since the group's last "
             "round; each patient's record is then replaced whole (what the EHR no longer holds leaves the index, under the "
             "rule of what an input may remove and its removal budget)"),
         arg("--workers", action="store_true", help="index the round's patients on the Celery workers (several at "
             "once) and follow them; the kick-off, status and downloads run here"), ALLOW_REMOVALS)
def cmd_sync(args, settings: Settings) -> int:
    from tqdm import tqdm

    registry = registry_for(settings)
    ehr = registry.ehr(args.tenant)
    if ehr is None:
        print(f"chartcite: no registered EHR named {args.tenant} (chartcite ehr list)", file=sys.stderr)
        return EXIT_USAGE
    if args.workers and settings.tasks_eager:
        print("chartcite: --workers needs Celery workers: set CHARTCITE_TASKS_EAGER=false and a broker "
              "(CHARTCITE_REDIS_URL), and start `chartcite worker`", file=sys.stderr)
        return EXIT_USAGE
    bar = tqdm(unit="patient", desc=f"sync {ehr.name}", file=sys.stderr)

    def progress(phase, done, total, note=""):
        bar.set_description(f"sync {ehr.name}: {phase}{' ' + note if note else ''}")
        bar.total, bar.n = total or None, done
        bar.refresh()

    try:
        summary = sync_round(args, settings, registry, ehr, progress)
    finally:
        bar.close()
    if isinstance(summary, int):
        return summary
    print_sync_summary(summary)
    if summary["state"] != "done":
        return EXIT_FAILED
    return EXIT_HELD_BACK if summary.get("held_back") else EXIT_OK


def sync_round(args, settings: Settings, registry, ehr, progress):
    """The round run here (or its parts on the workers), or the exit code and sentence of why not."""
    from fhir_ingest.connection.client import FhirError
    from fhir_ingest.connection.smart_auth import LaunchError
    from workers.bulk_round import NoGroup, SyncRunning, follow_round, run_bulk_sync
    from workers.progress import job_store

    dispatch = None
    if args.workers:
        from workers.runner import TaskRunner

        part = TaskRunner(settings).task("chartcite.index_bulk_part")
        dispatch = lambda round_id, n: part.delay(round_id, n)   # noqa: E731
    try:
        summary = run_bulk_sync(settings, registry, ehr, service(settings), args.group, progress, args.full, dispatch,
                                args.allow_removals)
        if summary["state"] == "indexing":
            summary = follow_round(settings, registry, summary["round"], progress)
        return summary
    except SyncRunning as exc:
        print(f"chartcite: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except NoGroup as exc:
        print(f"chartcite: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (FhirError, LaunchError) as exc:   # the EHR (or its SMART configuration) refused or could not be read
        registry.record_sync(ehr.name, f"failed: {exc}")
        job_store(settings).add("bulk_syncs", "failed")
        print(f"chartcite: sync failed: {exc}", file=sys.stderr)
        fix = getattr(exc, "fix", "")
        if fix:
            print(f"fix: {fix.replace('NAME', ehr.name)}", file=sys.stderr)
        return EXIT_FAILED


def print_sync_summary(summary: dict) -> None:
    from workers.bulk_round import cursor_words

    if summary["state"] == "abandoned":
        print("the round was abandoned: " + "; ".join(n for n in summary["notes"] if n.startswith("abandoned")))
        return
    print(f"synced {summary['patients']} patients ({summary['resources']} resources, {summary['embedded']} chunks "
          f"embedded of {summary['chunks']}); {summary['deleted']} deleted at the EHR "
          f"({summary.get('deletions_applied', 0)} removed here); {summary['skipped']} skipped; "
          f"{summary['export_errors']} export errors; "
          + (f"next sync from {summary['transaction_time']}" if summary["state"] == "done" else
             f"the cursor stays at {cursor_words(summary)}"))
    for item in summary.get("skipped_items", []):
        print(f"skipped: {item}")
    for failed in summary.get("failed_parts", []):
        print(f"failed: {failed}: the round stays open and its cursor where it was; the next sync indexes the "
              "parts left")
    for failed in summary["failed_files"]:
        print(f"incomplete: {failed}: the next sync reads this file again from where it stopped, and the rest "
              "of the round is kept")
    for words in summary["export_error_words"]:
        print(f"incomplete: the EHR could not export everything ({words}): the next sync asks again from the same "
              "cursor")
    seen = summary.get("since_seen") or {}
    if seen.get("older"):
        why = "the EHR ignored _since and sent its full export" if summary["since_ignored"] else \
            "changes the EHR backdated, clocks that disagree, or an EHR that ignores _since"
        print(f"note: {seen['older']} of the {seen['dated']} resources exported are dated before _since ({why}): they "
              "were merged into what is held and nothing was removed, and the next round asks from further back; "
              "`chartcite sync --full` replaces each record whole, applying deletions the EHR does not list")
    for note in summary["notes"] + summary["deletion_notes"]:
        print(f"note: {note}")
    for line in summary.get("not_removed", []):
        print(f"not removed: {line}")
    for line in summary.get("held_back", []):
        print(f"HELD BACK: {line}")
    if summary.get("cursor_refused"):
        print(f"warning: {summary['cursor_refused']}")


@command("beat", "start Celery beat: periodic re-sync of the tenant's records")
def cmd_beat(args, settings: Settings) -> int:
    from workers.celery_app import make_celery

    app = make_celery(settings)
    keep_chartcite_logging_in_celery()
    schedule = settings.data_dir / "celerybeat-schedule"
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    app.start(["beat", "--loglevel", settings.log_level.upper(), "--schedule", str(schedule)])
    return 0


@command("status", "queue depth and the last sync per tenant", JSON)
def cmd_status(args, settings: Settings) -> int:
    from dataclasses import replace

    from workers.progress import job_store
    from workers.runner import TaskRunner

    depth = TaskRunner(replace(settings, tasks_eager=False)).queue_depth()
    depth = "unavailable" if depth is None else depth
    jobs = job_store(settings).jobs()
    last = {}
    for job in jobs:
        if job.state == "done":
            last[job.tenant] = max(last.get(job.tenant, 0.0), job.updated_at)
    active = [j for j in jobs if j.state in ("queued", "running")]
    failed = [j for j in jobs if j.state == "failed"]
    when = lambda t: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    ehrs = [e.to_dict() for e in registry_for(settings).ehrs()]
    if args.json:
        print(json.dumps({"queue_depth": depth, "active": len(active), "failed": len(failed),
                          "last_sync": {t: when(v) for t, v in last.items()},
                          "ehrs": {e["name"]: {"last_bulk_sync": when(e["last_sync_at"]) if e["last_sync_at"] else None,
                                               "status": e["last_sync_status"]} for e in ehrs}}))
        return 0
    print(f"broker: {settings.masked()['celery_broker']}\nqueue depth: {depth}\nsyncing now: {len(active)}  failed: {len(failed)}")
    for tenant, at in sorted(last.items()):
        print(f"tenant {tenant}: last patient sync {when(at)}")
    for e in ehrs:
        at = when(e["last_sync_at"]) if e["last_sync_at"] else "never"
        print(f"EHR {e['name']}: last bulk sync {at}: {e['last_sync_status']}")
    return 0


@command("reindex", "rebuild a tenant's index and similarity profiles with the configured model (atomic alias swap)", TENANT)
def cmd_reindex(args, settings: Settings) -> int:
    from tqdm import tqdm

    tenant = args.tenant or settings.tenant
    bar = tqdm(unit="chunk", desc=f"reindexing {tenant}", file=sys.stderr)

    def progress(phase, done, total):
        bar.total = total
        bar.n = done
        bar.refresh()

    moved = service(settings).reindex(tenant, progress)
    bar.close()
    print(f"reindexed {moved} chunks for tenant {tenant}; the alias now points at the new index")
    return 0


@command("worker", "start a Celery worker for indexing tasks")
def cmd_worker(args, settings: Settings) -> int:
    from workers.celery_app import make_celery

    app = make_celery(settings)
    keep_chartcite_logging_in_celery()
    app.worker_main(["worker", "--loglevel", settings.log_level.upper(), "--concurrency", "1", "--pool", "solo"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
