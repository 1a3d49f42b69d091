"""ElasticsearchBackend: the same Backend contract on an Elasticsearch 8 cluster.

One chunk index per tenant behind an alias (`chartcite-<tenant>` → `chartcite-<tenant>-v<N>`),
created from an index template; a small records index per tenant for source resources and
patient summaries. Every query carries the tenant and patient filter inside the query (kNN
pre-filter and bool filter), never as a post-filter. Dense vectors use `flat` index options:
exact, deterministic search within a patient, as DESIGN.md asks. BM25 runs on the lexical text;
when the cluster has no English analyzer (the minimal distribution has no analysis-common module)
the text is stemmed in the application with the same Porter stemmer SQLite FTS5 uses.
"""
from __future__ import annotations

import logging
import re
import threading
from contextlib import contextmanager
from itertools import chain

import numpy as np
from elasticsearch.serializer import JsonSerializer, OrjsonSerializer

from fhir_ingest.record.compact import gathered
from fhir_ingest.record.contract import Chunk

from search.nlp.annotate import asserted_keys
from search.similar.version import PROFILE_VERSION
from search.backends.base import (PENDING_PROBLEM, VECTOR_PENDING, Backend, BackendError, BackendUnavailable, Hit,
                                  IndexCheck, ModelMismatch, ProfileGaps, Scope, Search, profile_gaps, profile_problems,
                                  summary_after_removal)
from search.backends.elastic_options import ElasticOptions  # noqa: F401  (where callers have always found it)
from search.backends.embedded import text_hash
from search.nlp.lexicon import tokens

log = logging.getLogger(__name__)
TEMPLATE = "chartcite-chunks"
# Every tenant's patient profiles, in one index with the tenant inside every query: a tenant's
# indices are chartcite-<tenant without hyphens>[-vN|-records], so this name is no tenant's.
PROFILES = "chartcite-patient-profiles"
MAX_RESULT = 10_000


def safe_tenant(tenant: str) -> str:
    clean = re.sub(r"[^a-z0-9_]", "_", tenant.lower())
    if not clean:
        raise BackendError("tenant names need at least one letter or digit")
    return clean


STEM_CACHE = 200_000


class TolerantOrjson(OrjsonSerializer):
    """orjson writes requests: a bulk request is mostly vectors, which the standard json module
    formats one Python float at a time. What orjson refuses (an integer beyond 64 bits in a
    hostile resource) goes through the standard module instead of failing the write, and
    responses are read by the standard module, which keeps such an integer exact."""

    def json_dumps(self, data) -> bytes:
        try:
            return super().json_dumps(data)
        except TypeError:          # orjson.JSONEncodeError is one
            return JsonSerializer.json_dumps(self, data)

    def json_loads(self, data: bytes):
        return JsonSerializer.json_loads(self, data)


class PorterText:
    """Application-side stemming for clusters without language analyzers (same stems as FTS5 porter)."""

    def __init__(self):
        import snowballstemmer

        self.stemmer = snowballstemmer.stemmer("porter")
        self.stems: dict[str, str] = {}

    def __call__(self, text: str) -> str:
        # Pure-Python stemming cost half a millisecond a chunk, most of a bulk write's client-side
        # time; a record's words repeat, so each is stemmed once (bounded: a clinical vocabulary).
        out = []
        for word in tokens(text):
            stem = self.stems.get(word)
            if stem is None:
                stem = self.stemmer.stemWord(word)
                if len(self.stems) < STEM_CACHE:
                    self.stems[word] = stem
            out.append(stem)
        return " ".join(out)


class ElasticsearchBackend(Backend):
    allocation_wait = "20s"     # how long a new index may take to place its shard before we say why not

    def __init__(self, urls: list[str], embedding_model: str | None, dimension: int = 0, *, api_key: str = "",
                 username: str = "", password: str = "", ca_certs: str = "", verify_certs: bool = True,
                 shards: int = 1, replicas: int = 0, check_model: bool = True, request_timeout: float = 30.0):
        from elasticsearch import Elasticsearch

        options = {"request_timeout": request_timeout, "retry_on_timeout": True, "max_retries": 3}
        if api_key:
            options["api_key"] = api_key
        elif username:
            options["basic_auth"] = (username, password)
        if ca_certs:
            options["ca_certs"] = ca_certs
        if not verify_certs:
            options["verify_certs"] = False
        self.urls = urls
        self.es = Elasticsearch(urls, serializer=TolerantOrjson(), **options)
        self.embedding_model = embedding_model
        self.dimension = dimension
        self.check_model = check_model
        self.shards, self.replicas = shards, replicas
        self._ready: set[str] = set()
        self._deferred = threading.local()     # indices this thread's writes left unrefreshed
        self._call(lambda: self.es.cluster.health(wait_for_status="yellow", timeout="30s"))
        self.english = self._has_module("analysis-common")
        self.stem = None if self.english else PorterText()
        self._put_template()

    # --- plumbing ---------------------------------------------------------------------------
    def _call(self, fn):
        from elasticsearch import ApiError, ConnectionError as ESConnectionError, TransportError

        try:
            return fn()
        except ESConnectionError as exc:
            raise BackendUnavailable(f"cannot reach Elasticsearch at {', '.join(self.urls)}: {exc.message}") from exc
        except ApiError as exc:
            self._raise_for(exc.meta.status, exc.body.get("error") if isinstance(exc.body, dict) else exc.body, exc)
        except TransportError as exc:
            raise BackendUnavailable(f"Elasticsearch transport error: {exc}") from exc

    @staticmethod
    def _raise_for(status: int, error, cause: Exception | None = None):
        """An Elasticsearch refusal (a whole request's, or one search's inside an `_msearch`)."""
        if status == 429:
            raise BackendUnavailable("Elasticsearch is overloaded (429 Too Many Requests); retry later") from cause
        if status in (502, 503, 504):
            # A shard with no copy available (a node just left and its replica is not yet
            # promoted; inside an `_msearch` a search on it answers 502 "Partial shards
            # failure"): the whole answer waits rather than come from part of the record.
            raise BackendUnavailable("Elasticsearch has shards unavailable (a node left the cluster); "
                                     "retry in a few seconds") from cause
        reason = error.get("reason") if isinstance(error, dict) else str(error)
        raise BackendError(f"Elasticsearch refused the request ({status}): {reason}") from cause

    def _has_module(self, name: str) -> bool:
        info = self._call(lambda: self.es.nodes.info(metric="plugins"))
        return all(any(m["name"] == name for m in node.get("modules", [])) for node in info["nodes"].values())

    def _put_template(self) -> None:
        lexical = {"type": "text", "analyzer": "english" if self.english else "standard"}
        mappings = {
            "dynamic": "strict",
            "properties": {
                "chunk_id": {"type": "keyword"}, "tenant": {"type": "keyword"}, "patient_id": {"type": "keyword"},
                "resource_type": {"type": "keyword"}, "ref": {"type": "keyword"}, "refs": {"type": "keyword"},
                "semantic_type": {"type": "keyword"}, "category": {"type": "keyword"}, "codes": {"type": "keyword"},
                "concepts": {"type": "keyword"}, "date": {"type": "keyword"}, "text_hash": {"type": "keyword"},
                "lexical": lexical, "data": {"type": "object", "enabled": False},
                "vector": {"type": "dense_vector", "dims": self.dimension or 384, "index": True,
                           "similarity": "cosine", "index_options": {"type": "flat"}},
            },
        }
        body = {"index_patterns": ["chartcite-*-v*"], "priority": 100,
                "template": {"settings": {"number_of_shards": self.shards, "number_of_replicas": self.replicas},
                             "mappings": mappings}}
        self._call(lambda: self.es.indices.put_index_template(name=TEMPLATE, **body))

    def alias(self, tenant: str) -> str:
        return f"chartcite-{safe_tenant(tenant)}"

    def records_index(self, tenant: str) -> str:
        return f"chartcite-{safe_tenant(tenant)}-records"

    def current_index(self, tenant: str) -> str | None:
        alias = self.alias(tenant)
        if not self._call(lambda: self.es.indices.exists_alias(name=alias)):
            return None
        return sorted(self._call(lambda: self.es.indices.get_alias(name=alias)).keys())[-1]

    def built_with(self) -> set[str]:
        """The models of every tenant's current chunk index (an index a reindex left behind, no
        longer under its alias, does not count)."""
        current = [index for index, entry in self._call(lambda: self.es.indices.get_alias(
            index="chartcite-*-v*", allow_no_indices=True, ignore_unavailable=True)).items() if entry.get("aliases")]
        if not current:
            return set()
        mappings = self._call(lambda: self.es.indices.get_mapping(index=",".join(current)))
        return {mapping["mappings"].get("_meta", {}).get("embedding_model", "") for mapping in mappings.values()} - {""}

    def _versioned(self, tenant: str, version: int) -> str:
        return f"{self.alias(tenant)}-v{version}"

    def _create_chunk_index(self, name: str, model: str, dimension: int) -> None:
        mappings = {"_meta": {"embedding_model": model, "dimension": dimension},
                    "properties": {"vector": {"type": "dense_vector", "dims": dimension, "index": True,
                                              "similarity": "cosine", "index_options": {"type": "flat"}}}}
        self._create_index(name, mappings=mappings)

    def _create_index(self, name: str, **body) -> None:
        """Create an index, idempotently: when a slow create times out, the client's retry (or
        another worker starting the same tenant) finds it already there, which is success."""
        from elasticsearch import ApiError

        try:
            created = self._call(lambda: self.es.indices.create(index=name, **body))
        except BackendError as exc:
            cause = exc.__cause__
            error = cause.body.get("error") if isinstance(cause, ApiError) and isinstance(cause.body, dict) else None
            if isinstance(error, dict) and error.get("type") == "resource_already_exists_exception":
                return
            if cause is not None and getattr(getattr(cause, "meta", None), "status", None) == 408:
                self._require_allocated(name)
                return
            raise
        if not created.get("shards_acknowledged", True):
            self._require_allocated(name)

    def _require_allocated(self, name: str) -> None:
        """An index whose primary shard cannot be placed fails every search with "all shards
        failed"; say why at creation instead (typically the disk watermark of a nearly full disk)."""
        # A health wait that times out answers 408 with the health body; the body is what we want.
        health = self._call(lambda: self.es.options(ignore_status=408).cluster.health(
            index=name, wait_for_status="yellow", timeout=self.allocation_wait))
        if not health.get("timed_out"):
            return
        raise BackendUnavailable(f"Elasticsearch cannot place the index {name}: {self._allocation_reason(name)}")

    def _allocation_reason(self, name: str) -> str:
        try:
            explain = self.es.cluster.allocation_explain(index=name, shard=0, primary=True)
        except Exception as exc:  # the explanation is a courtesy; the caller raises either way
            return f"no allocation explanation ({type(exc).__name__})"
        reasons = [decider.get("explanation", "")
                   for node in explain.get("node_allocation_decisions", [])
                   for decider in node.get("deciders", []) if decider.get("decision") == "NO"]
        return "; ".join(reasons) or explain.get("allocate_explanation", "shard unassigned")

    def _ensure(self, tenant: str) -> str:
        """The tenant's chunk alias, created on first use and checked against this process's model."""
        alias = self.alias(tenant)
        if alias in self._ready:
            return alias
        index = self.current_index(tenant)
        if index is None:
            if self.embedding_model is None:
                return alias       # catalogue reads of a tenant that has no index yet
            first = self._versioned(tenant, 1)
            self._create_chunk_index(first, self.embedding_model, self.dimension)
            self._call(lambda: self.es.indices.put_alias(index=first, name=alias))
        elif self.check_model and self.embedding_model is not None:
            meta = self._call(lambda: self.es.indices.get_mapping(index=index))[index]["mappings"].get("_meta", {})
            if meta.get("embedding_model") != self.embedding_model:
                raise ModelMismatch(
                    f"the index {index} was built with embedding model {meta.get('embedding_model')!r}, but this "
                    f"process uses {self.embedding_model!r}; run `chartcite reindex --tenant {tenant}` to rebuild "
                    f"it with the configured model (questions keep working on the old index meanwhile)")
        records = self.records_index(tenant)
        if not self._call(lambda: self.es.indices.exists(index=records)):
            self._create_index(records, settings={
                "number_of_shards": 1, "number_of_replicas": self.replicas}, mappings={"dynamic": False, "properties": {
                    "kind": {"type": "keyword"}, "patient_id": {"type": "keyword"}, "ref": {"type": "keyword"},
                    "data": {"type": "object", "enabled": False}}})
        self._ready.add(alias)
        return alias

    def _lexical(self, text: str) -> str:
        return self.stem(text) if self.stem else text

    # --- writing ----------------------------------------------------------------------------
    @contextmanager
    def deferred_refresh(self):
        """This thread's writes inside the block are made searchable by one refresh at its end,
        not one per write: a Bulk Data round writes many patients nobody is waiting on, and a
        refresh per patient cost half the bulk rate. Other threads (a launch's sync, questions)
        are not affected."""
        if getattr(self._deferred, "indices", None) is not None:
            yield          # inside another such block: its end refreshes these writes too
            return
        self._deferred.indices = set()
        try:
            yield
        finally:
            indices, self._deferred.indices = self._deferred.indices, None
            for index in sorted(indices):
                self._call(lambda: self.es.indices.refresh(index=index))

    def _refresh(self, index: str) -> None:
        deferred = getattr(self._deferred, "indices", None)
        if deferred is None:
            self._call(lambda: self.es.indices.refresh(index=index))
        else:
            deferred.add(index)

    def _doc(self, chunk: Chunk, vector, lexical: str) -> dict:
        chunk.embedding_model = self.embedding_model or chunk.embedding_model
        doc = {"chunk_id": chunk.chunk_id, "tenant": chunk.tenant, "patient_id": chunk.patient_id,
               "resource_type": chunk.resource_type, "ref": chunk.ref, "refs": chunk.refs,
               "semantic_type": chunk.semantic_type, "category": chunk.category,
               "codes": [f"{c['system']}|{c['code']}" for c in chunk.codes],
               "concepts": sorted(asserted_keys(chunk.concepts)), "date": chunk.date,
               "text_hash": VECTOR_PENDING if vector is None else text_hash(chunk, lexical),
               "lexical": self._lexical(lexical), "data": chunk.to_dict()}
        if vector is not None:       # kNN passes over a document without one
            doc["vector"] = np.asarray(vector, dtype=np.float32)
        return doc

    def _bulk(self, actions, missing_is_gone: bool = False) -> int:
        """Write `actions`; `missing_is_gone`: an update of a document that no longer exists is
        skipped rather than failed (its chunk was removed meanwhile, so there is nothing to update)."""
        from elasticsearch.helpers import streaming_bulk

        failed, done = [], 0

        def run():
            nonlocal done
            # Retries 429s with exponential backoff; anything else that fails is reported, so no
            # acknowledged write is silently lost.
            for ok, item in streaming_bulk(self.es, actions, chunk_size=200, max_retries=5, initial_backoff=1,
                                           max_backoff=30, raise_on_error=False, raise_on_exception=True):
                if ok:
                    done += 1
                elif not (missing_is_gone and item.get("update", {}).get("status") == 404):
                    failed.append(item)
        self._call(run)
        if failed:
            first = next(iter(failed[0].values()))
            raise BackendError(f"Elasticsearch rejected {len(failed)} documents, e.g. {first.get('error')}")
        return done

    def index(self, chunks: list[Chunk], vectors: np.ndarray, lexical_texts: list[str]) -> None:
        if not chunks:
            return
        alias = self._ensure(chunks[0].tenant)
        self.write_chunks(alias, chunks, vectors, lexical_texts)

    def write_chunks(self, index: str, chunks: list[Chunk], vectors, lexical_texts: list[str]) -> None:
        actions = ({"_op_type": "index", "_index": index, "_id": c.chunk_id, "_source": self._doc(c, v, lx)}
                   for c, v, lx in zip(chunks, vectors, lexical_texts))
        self._bulk(actions)
        self._refresh(index)

    def add_vectors(self, chunks: list[Chunk], vectors: np.ndarray, lexical_texts: list[str]) -> None:
        if not chunks:
            return
        alias = self._ensure(chunks[0].tenant)
        # A chunk removed between its words and its vector (a Bulk round deleting the resource
        # meanwhile) needs no vector: skipped, as the embedded backend's UPDATE skips it.
        self._bulk(({"_op_type": "update", "_index": alias, "_id": c.chunk_id,
                     "doc": {"vector": np.asarray(v, dtype=np.float32), "text_hash": text_hash(c, lx)}}
                    for c, v, lx in zip(chunks, vectors, lexical_texts)), missing_is_gone=True)
        self._refresh(alias)

    def delete_chunks(self, tenant: str, chunk_ids: list[str]) -> int:
        if not chunk_ids:
            return 0
        alias = self._ensure(tenant)
        index = self.current_index(tenant)
        removed = self._bulk({"_op_type": "delete", "_index": index, "_id": c} for c in chunk_ids)
        self._refresh(alias)
        return removed

    def delete_refs(self, tenant: str, patient_id: str, refs: list[str]) -> int:
        # Search, then bulk-delete by id: delete_by_query lives in the reindex module, which the
        # minimal distribution does not ship. The chunks, the stored resources and the summary go
        # in one bulk request.
        refs = list(dict.fromkeys(refs))
        if not refs:
            return 0
        alias = self._ensure(tenant)
        chunks = self._search(tenant, size=MAX_RESULT, source=["semantic_type", "text_hash"], query={"bool": {
            "filter": [{"term": {"tenant": tenant}}, {"term": {"patient_id": patient_id}}, {"terms": {"refs": refs}}]}})
        records = self.records_index(tenant)
        stored = list(self.get_resources(tenant, patient_id, refs))
        summary = self.get_patient(tenant, patient_id)
        actions = [{"_op_type": "delete", "_index": self.current_index(tenant), "_id": h["_id"]} for h in chunks]
        actions += [{"_op_type": "delete", "_index": records, "_id": f"{patient_id}|{ref}"} for ref in stored]
        if summary is not None and (chunks or stored):
            updated = summary_after_removal(summary, [h["_source"]["semantic_type"] for h in chunks],
                                            sum(h["_source"]["text_hash"] == VECTOR_PENDING for h in chunks), stored)
            actions.append({"_op_type": "index", "_index": records, "_id": f"patient|{patient_id}",
                            "_source": {"kind": "patient", "patient_id": patient_id, "data": updated}})
        if actions:
            self._bulk(actions)
            self._refresh(alias)
            self._refresh(records)
        return len(chunks)

    def holders(self, tenant: str, refs: list[str]) -> dict[str, set[str]]:
        from elasticsearch.helpers import scan

        refs = list(dict.fromkeys(refs))
        found: dict[str, set[str]] = {ref: set() for ref in refs}
        index = self.records_index(tenant)
        if not refs or not self._call(lambda: self.es.indices.exists(index=index)):
            return found
        query = {"query": {"bool": {"filter": [{"term": {"kind": "resource"}}, {"terms": {"ref": refs}}]}},
                 "_source": ["ref", "patient_id"]}
        for hit in self._call(lambda: list(scan(self.es, index=index, query=query))):
            found[hit["_source"]["ref"]].add(hit["_source"]["patient_id"])
        return found

    def store_resources(self, tenant: str, patient_id: str, resources: list[dict]) -> None:
        from elasticsearch.helpers import scan

        self._ensure(tenant)
        index = self.records_index(tenant)
        kept = {f"{patient_id}|{r['resourceType']}/{r['id']}" for r in resources}
        query = {"query": {"bool": {"filter": [{"term": {"kind": "resource"}}, {"term": {"patient_id": patient_id}}]}}}
        gone = [hit["_id"] for hit in self._call(lambda: list(scan(self.es, index=index, query=query, _source=False)))
                if hit["_id"] not in kept]
        self._bulk(chain(
            ({"_op_type": "index", "_index": index, "_id": f"{patient_id}|{r['resourceType']}/{r['id']}",
              "_source": {"kind": "resource", "patient_id": patient_id, "ref": f"{r['resourceType']}/{r['id']}",
                          "data": r}} for r in resources),
            ({"_op_type": "delete", "_index": index, "_id": i} for i in gone)))
        self._refresh(index)

    def upsert_patient(self, tenant: str, patient_id: str, summary: dict) -> None:
        self._ensure(tenant)
        index = self.records_index(tenant)
        deferred = getattr(self._deferred, "indices", None)
        self._call(lambda: self.es.index(index=index, id=f"patient|{patient_id}", refresh=deferred is None,
                                         document={"kind": "patient", "patient_id": patient_id, "data": summary}))
        if deferred is not None:
            deferred.add(index)

    # --- reading ----------------------------------------------------------------------------
    @staticmethod
    def _filters(scope: Scope) -> list[dict]:
        filters = [{"term": {"tenant": scope.tenant}}, {"term": {"patient_id": scope.patient_id}}]
        if scope.semantic_types:
            filters.append({"terms": {"semantic_type": list(scope.semantic_types)}})
        if scope.date_from or scope.date_to:
            rng = {}
            if scope.date_from:
                rng["gte"] = scope.date_from
            if scope.date_to:
                rng["lte"] = scope.date_to + "\uffff"   # dates are ISO strings; include the whole last day
            filters.append({"range": {"date": rng}})
        return filters

    def _search(self, tenant: str, **body) -> list[dict]:
        alias = self._ensure(tenant)
        return self._call(lambda: self.es.search(index=alias, ignore_unavailable=True, allow_no_indices=True,
                                                 allow_partial_search_results=False, **body))["hits"]["hits"]

    def search_many(self, searches: list[Search]) -> list[list[Hit]]:
        """One `_msearch` for the lot. A tenant with no index yet has no hits (ignore_unavailable);
        never hits from part of the shards: a missing shard is part of this patient's record."""
        bodies = [self._body(s) for s in searches]
        wanted = [(s, b) for s, b in zip(searches, bodies) if b is not None]
        responses = []
        if wanted:
            alias = self._ensure(searches[0].scope.tenant)
            header = {"index": alias, "ignore_unavailable": True, "allow_no_indices": True,
                      "allow_partial_search_results": False}
            lines = [line for _, body in wanted for line in (header, body)]
            responses = self._call(lambda: self.es.msearch(searches=lines))["responses"]
        answered = iter(responses)
        return [self._hits(s, next(answered)) if b is not None else [] for s, b in zip(searches, bodies)]

    def _body(self, s: Search) -> dict | None:
        """The search body for one search, or None when there is nothing to search for."""
        filters = self._filters(s.scope)
        if s.kind == "text":
            text = self._lexical(str(s.query))
            if not text.strip():
                return None
            return {"size": s.n, "_source": False, "query": {"bool": {
                "filter": filters, "must": [{"match": {"lexical": {"query": text, "operator": "or"}}}]}}}
        if s.kind == "vector":
            return {"size": s.n, "_source": False, "knn": {
                "field": "vector", "query_vector": [float(x) for x in s.query], "k": s.n, "num_candidates": MAX_RESULT,
                "filter": {"bool": {"filter": filters}}}}
        if s.kind == "concepts":
            if not s.query:
                return None
            should = [{"constant_score": {"filter": {"term": {"concepts": key}}, "boost": 1.0}} for key in s.query]
            return {"size": s.n, "_source": False, "sort": [{"_score": "desc"}, {"date": "desc"}],
                    "query": {"bool": {"filter": filters, "should": should, "minimum_should_match": 1}}}
        return {"size": s.n, "_source": False, "sort": [{"date": "desc"}, {"chunk_id": "asc"}],
                "query": {"bool": {"filter": filters}}}

    def _hits(self, s: Search, response: dict) -> list[Hit]:
        if "error" in response:
            self._raise_for(response.get("status", 500), response["error"])
        hits = response["hits"]["hits"]
        if s.kind == "vector":
            # ES reports cosine as (1 + cos) / 2; give callers the cosine itself, like the embedded backend.
            return [Hit(h["_id"], 2.0 * float(h["_score"]) - 1.0) for h in hits]
        return [Hit(h["_id"], float(h["_score"] or 0.0) if s.kind != "latest" else 0.0) for h in hits]

    def search_text(self, scope: Scope, query: str, n: int) -> list[Hit]:
        return self.search_many([Search("text", scope, query, n)])[0]

    def search_vector(self, scope: Scope, vector: np.ndarray, n: int) -> list[Hit]:
        return self.search_many([Search("vector", scope, vector, n)])[0]

    def search_concepts(self, scope: Scope, concept_keys: list[str], n: int) -> list[Hit]:
        return self.search_many([Search("concepts", scope, concept_keys, n)])[0]

    def latest(self, scope: Scope, n: int) -> list[Hit]:
        return self.search_many([Search("latest", scope, None, n)])[0]

    def has_terms(self, tenant: str, patient_id: str, terms: list[str], prefix: bool = False) -> set[str]:
        alias = self._ensure(tenant)
        found = set()
        for term in terms:
            filters = [{"term": {"tenant": tenant}}, {"term": {"patient_id": patient_id}}]
            # A prefix is looked up as written: the indexed words are stems, and a stem begins with
            # the word's first letters up to a consonant (search/nlp/vocabulary.presence_prefix).
            words = ({"prefix": {"lexical": term.lower()}} if prefix and " " not in term.strip()
                     else {"match_phrase_prefix" if prefix else "match": {"lexical": self._lexical(term)}})
            query = {"bool": {"filter": filters, "must": [words]}}
            if self._call(lambda: self.es.count(index=alias, query=query))["count"]:
                found.add(term)
        return found

    def refs_in_scope(self, scope: Scope, refs: list[str]) -> set[str]:
        if not refs:
            return set()
        hits = self._search(scope.tenant, size=MAX_RESULT, source=["refs"], query={"bool": {
            "filter": self._filters(scope) + [{"terms": {"refs": refs}}]}})
        return {r for h in hits for r in h["_source"]["refs"]} & set(refs)

    def count(self, scope: Scope) -> int:
        alias = self._ensure(scope.tenant)
        if not self._call(lambda: self.es.indices.exists_alias(name=alias)):
            return 0
        return int(self._call(lambda: self.es.count(index=alias, query={"bool": {"filter": self._filters(scope)}}))["count"])

    def get_chunks(self, tenant: str, chunk_ids: list[str]) -> list[Chunk]:
        if not chunk_ids:
            return []
        alias = self._ensure(tenant)
        # One round trip: a tenant with no index yet answers 404, meaning no chunks (an exists
        # check first doubled every read of a question's evidence).
        found = self._call(lambda: self.es.options(ignore_status=404).mget(index=alias, ids=chunk_ids,
                                                                          source=["data", "tenant"]))
        docs = found.get("docs", [])
        by_id = {d["_id"]: Chunk.from_dict(d["_source"]["data"]) for d in docs
                 if d.get("found") and d["_source"]["tenant"] == tenant}
        return [by_id[c] for c in chunk_ids if c in by_id]

    def indexed_texts(self, tenant: str, patient_id: str) -> dict[str, str]:
        from elasticsearch.helpers import scan

        alias = self._ensure(tenant)
        if not self._call(lambda: self.es.indices.exists_alias(name=alias)):
            return {}
        query = {"query": {"bool": {"filter": [{"term": {"tenant": tenant}}, {"term": {"patient_id": patient_id}}]}},
                 "_source": ["text_hash"]}
        return self._call(lambda: {h["_id"]: h["_source"]["text_hash"] for h in scan(self.es, index=alias, query=query)})

    def patient_resources(self, tenant: str, patient_id: str) -> list[dict]:
        from elasticsearch import NotFoundError
        from elasticsearch.helpers import scan

        query = {"query": {"bool": {"filter": [{"term": {"kind": "resource"}}, {"term": {"patient_id": patient_id}}]}}}

        def read():
            try:
                # Hit by hit: a large record's come back compact (fhir_ingest/record/compact.py).
                return gathered(hit["_source"]["data"] for hit in scan(self.es, index=self.records_index(tenant), query=query))
            except NotFoundError:
                return []
        return self._call(read)

    def _get_record(self, tenant: str, doc_id: str) -> dict | None:
        """A document of the records index, or None; every other failure through the error mapping."""
        from elasticsearch import NotFoundError

        def get():
            try:
                return self.es.get(index=self.records_index(tenant), id=doc_id)["_source"]
            except NotFoundError:
                return None
        return self._call(get)

    def get_resource(self, tenant: str, patient_id: str, ref: str) -> dict | None:
        doc = self._get_record(tenant, f"{patient_id}|{ref}")
        return doc["data"] if doc and doc["patient_id"] == patient_id else None

    def get_resources(self, tenant: str, patient_id: str, refs: list[str]) -> dict[str, dict]:
        if not refs:
            return {}
        ids = [f"{patient_id}|{ref}" for ref in refs]
        found = self._call(lambda: self.es.options(ignore_status=404).mget(index=self.records_index(tenant), ids=ids))
        docs = {d["_id"]: d["_source"] for d in found.get("docs", []) if d.get("found")}
        return {ref: docs[i]["data"] for ref, i in zip(refs, ids) if i in docs and docs[i]["patient_id"] == patient_id}

    def get_patient(self, tenant: str, patient_id: str) -> dict | None:
        doc = self._get_record(tenant, f"patient|{patient_id}")
        return doc["data"] if doc else None

    def has_patients(self, tenant: str) -> bool:
        index = self.records_index(tenant)
        if not self._call(lambda: self.es.indices.exists(index=index)):
            return False
        return self._call(lambda: self.es.count(index=index, query={"term": {"kind": "patient"}}))["count"] > 0

    def list_patients(self, tenant: str) -> list[dict]:
        index = self.records_index(tenant)
        if not self._call(lambda: self.es.indices.exists(index=index)):
            return []
        hits = self._call(lambda: self.es.search(index=index, size=MAX_RESULT, query={"term": {"kind": "patient"}},
                                                 sort=[{"patient_id": "asc"}]))["hits"]["hits"]
        return [h["_source"]["data"] for h in hits]

    # --- patient profiles -------------------------------------------------------------------
    # One index per vector dimension (a model of another size writes beside, never into, the
    # other): chartcite-patient-profiles-d384. Reads go through the pattern.
    def _ensure_profiles(self, dimension: int) -> str:
        """The profiles index of this dimension, approximate kNN (HNSW): a workspace may hold 100,000 patients."""
        index = f"{PROFILES}-d{dimension}"
        if index in self._ready:
            return index
        if not self._call(lambda: self.es.indices.exists(index=index)):
            self._create_index(index, settings={"number_of_shards": self.shards, "number_of_replicas": self.replicas},
                               mappings={"dynamic": False, "properties": {
                                   "tenant": {"type": "keyword"}, "patient_id": {"type": "keyword"},
                                   "keys": {"type": "keyword"}, "data": {"type": "object", "enabled": False},
                                   "vector": {"type": "dense_vector", "dims": dimension, "index": True,
                                              "similarity": "cosine"}}})
        self._ready.add(index)
        return index

    @staticmethod
    def _profile_id(tenant: str, patient_id: str) -> str:
        return f"{safe_tenant(tenant)}|{tenant}|{patient_id}"

    def put_profile(self, tenant: str, patient_id: str, profile: dict, keys: list[str], vector: np.ndarray) -> None:
        index = self._ensure_profiles(len(vector))
        document = {"tenant": tenant, "patient_id": patient_id, "keys": keys, "data": profile,
                    "vector": [float(x) for x in vector]}
        deferred = getattr(self._deferred, "indices", None)
        self._call(lambda: self.es.index(index=index, id=self._profile_id(tenant, patient_id),
                                         refresh=deferred is None, document=document))
        if deferred is not None:
            deferred.add(index)

    def _profile_search(self, tenant: str, query: dict, size: int, source: list[str]) -> list[dict]:
        """Hits of every profiles index, the tenant's only."""
        scoped = {"bool": {"filter": [{"term": {"tenant": tenant}}, query]}}
        return self._call(lambda: self.es.search(index=f"{PROFILES}-d*", query=scoped, size=size, source=source,
                                                 ignore_unavailable=True, allow_no_indices=True))["hits"]["hits"]

    def nearest_profiles(self, tenant: str, patient_id: str, n: int) -> list[tuple[str, float]]:
        own = self._profile_search(tenant, {"ids": {"values": [self._profile_id(tenant, patient_id)]}}, 1, ["vector"])
        if not own:
            return []
        # The tenant filter is inside the kNN search, so the k nearest are the tenant's own.
        knn = {"field": "vector", "query_vector": own[0]["_source"]["vector"], "k": n,
               "num_candidates": min(max(10 * n, 100), MAX_RESULT),
               "filter": {"bool": {"filter": [{"term": {"tenant": tenant}}],
                                   "must_not": [{"term": {"patient_id": patient_id}}]}}}
        hits = self._call(lambda: self.es.search(index=own[0]["_index"], knn=knn, size=n, source=["patient_id"],
                                                 allow_partial_search_results=False))["hits"]["hits"]
        # ES reports cosine as (1 + cos) / 2; callers get the cosine, as from the embedded backend.
        return [(h["_source"]["patient_id"], 2.0 * float(h["_score"]) - 1.0) for h in hits]

    def get_profiles(self, tenant: str, patient_ids: list[str]) -> dict[str, dict]:
        if not patient_ids:
            return {}
        ids = [self._profile_id(tenant, pid) for pid in patient_ids]
        hits = self._profile_search(tenant, {"ids": {"values": ids}}, min(len(ids) * 2, MAX_RESULT), ["patient_id", "data"])
        return {h["_source"]["patient_id"]: h["_source"]["data"] for h in hits}

    def cohort_profiles(self, tenant: str, exposures: list[str], conditions: list[str], measure: str) -> list[dict]:
        if not exposures or not conditions:
            return []
        from elasticsearch.helpers import scan

        query = {"bool": {"filter": [{"term": {"tenant": tenant}}, {"terms": {"keys": exposures}},
                                     {"terms": {"keys": conditions}}]}}
        # Source filtering: only the medications and the one series leave the cluster.
        wanted = ["patient_id", "data.medications", f"data.measures.{measure}"]
        hits = self._call(lambda: list(scan(self.es, index=f"{PROFILES}-d*", query={"query": query}, source=wanted,
                                            ignore_unavailable=True, allow_no_indices=True)))
        read = [{"patient_id": h["_source"]["patient_id"], "medications": h["_source"].get("data", {}).get("medications", []),
                 "measures": h["_source"].get("data", {}).get("measures", {})} for h in hits]
        return sorted(read, key=lambda p: p["patient_id"])

    def key_frequencies(self, tenant: str, keys: list[str]) -> tuple[int, dict[str, int]]:
        keys = list(dict.fromkeys(keys))
        found = self._call(lambda: self.es.search(
            index=f"{PROFILES}-d*", size=0, track_total_hits=True, query={"term": {"tenant": tenant}},
            aggs={"keys": {"terms": {"field": "keys", "include": keys or ["-"], "size": max(len(keys), 1)}}},
            ignore_unavailable=True, allow_no_indices=True))
        counts = {b["key"]: b["doc_count"] for b in found.get("aggregations", {}).get("keys", {}).get("buckets", [])}
        return found["hits"]["total"]["value"], counts

    def delete_profile(self, tenant: str, patient_id: str, keep_dimension: int | None = None) -> None:
        kept = f"{PROFILES}-d{keep_dimension}"
        held = self._profile_search(tenant, {"ids": {"values": [self._profile_id(tenant, patient_id)]}}, 10, False)
        actions = [{"_op_type": "delete", "_index": h["_index"], "_id": h["_id"]} for h in held if h["_index"] != kept]
        if actions:
            self._bulk(actions)
            for index in {a["_index"] for a in actions}:
                self._refresh(index)

    def profile_versions(self, tenant: str) -> dict[str, int]:
        from elasticsearch.helpers import scan

        query = {"query": {"term": {"tenant": tenant}}, "_source": ["patient_id", "data.version"]}
        hits = self._call(lambda: list(scan(self.es, index=f"{PROFILES}-d*", query=query,
                                            ignore_unavailable=True, allow_no_indices=True)))
        return {hit["_source"]["patient_id"]: int(hit["_source"].get("data", {}).get("version") or 0) for hit in hits}

    def profile_dimensions(self, tenant: str) -> dict[str, list[int]]:
        from elasticsearch.helpers import scan

        query = {"query": {"term": {"tenant": tenant}}, "_source": ["patient_id"]}
        hits = self._call(lambda: list(scan(self.es, index=f"{PROFILES}-d*", query=query,
                                            ignore_unavailable=True, allow_no_indices=True)))
        found: dict[str, list[int]] = {}
        for hit in hits:
            found.setdefault(hit["_source"]["patient_id"], []).append(int(hit["_index"].rsplit("-d", 1)[1]))
        return {pid: sorted(sizes) for pid, sizes in found.items()}

    def _holding_records(self, tenant: str) -> set[str]:
        """The patients of whom the tenant's records index holds a source resource."""
        index = self.records_index(tenant)
        if not self._call(lambda: self.es.indices.exists(index=index)):
            return set()
        # Paged (a composite aggregation): a workspace may hold more patients than one page.
        holding: set[str] = set()
        after = None
        while True:
            source = {"size": MAX_RESULT, "sources": [{"patient": {"terms": {"field": "patient_id"}}}]}
            if after:
                source["after"] = after
            found = self._call(lambda: self.es.search(index=index, size=0, query={"term": {"kind": "resource"}},
                                                      aggs={"patients": {"composite": source}}))["aggregations"]["patients"]
            holding |= {b["key"]["patient"] for b in found["buckets"]}
            after = found.get("after_key")
            if not found["buckets"] or not after:
                return holding

    def check(self, tenant: str) -> IndexCheck:
        from search.backends.embedded import summary_disagreement

        alias = self.alias(tenant)
        if not self._call(lambda: self.es.indices.exists(index=alias)):
            return IndexCheck({"chunks": 0, "patients": 0}, [])
        per_patient = self._call(lambda: self.es.search(
            index=alias, size=0, track_total_hits=True, query={"term": {"tenant": tenant}},
            aggs={"patients": {"terms": {"field": "patient_id", "size": MAX_RESULT}}}))
        actual = {b["key"]: b["doc_count"] for b in per_patient["aggregations"]["patients"]["buckets"]}
        summaries = {p["patient_id"]: p for p in self.list_patients(tenant)}
        counts = {"chunks": per_patient["hits"]["total"]["value"], "patients": len(summaries)}
        pending = self._call(lambda: self.es.count(index=alias, query={"bool": {"filter": [
            {"term": {"tenant": tenant}}, {"term": {"text_hash": VECTOR_PENDING}}]}}))["count"]
        counts["vectors pending"] = pending
        problems = [f"{pending} {PENDING_PROBLEM}"] if pending else []
        orphaned = sum(n for pid, n in actual.items() if pid not in summaries)
        if orphaned:
            problems.append(f"{orphaned} chunks of a patient with no summary")
        for pid, summary in summaries.items():
            problems += summary_disagreement(pid, summary, actual.get(pid, 0))
        profile_counts, profile_said, profile_warnings = profile_problems(self.profile_gaps(tenant))
        return IndexCheck({**counts, **profile_counts}, problems + profile_said, profile_warnings)

    def profile_gaps(self, tenant: str) -> ProfileGaps:
        return profile_gaps(self._holding_records(tenant), self.profile_dimensions(tenant), self.dimension,
                            self.profile_versions(tenant), PROFILE_VERSION)

    # --- reindex with an atomic alias swap -------------------------------------------------
    def scan_chunks(self, tenant: str):
        """Every chunk of the tenant with its lexical text, from the index the alias points at."""
        from elasticsearch.helpers import scan

        index = self.current_index(tenant)
        if index is None:
            return
        for hit in scan(self.es, index=index, query={"query": {"term": {"tenant": tenant}}, "_source": ["data", "lexical"]}):
            yield Chunk.from_dict(hit["_source"]["data"])

    def start_reindex(self, tenant: str, model: str, dimension: int) -> str:
        current = self.current_index(tenant)
        version = int(current.rsplit("-v", 1)[1]) + 1 if current else 1
        target = self._versioned(tenant, version)
        if self._call(lambda: self.es.indices.exists(index=target)):
            self._call(lambda: self.es.indices.delete(index=target))   # a half-finished earlier attempt
        self._create_chunk_index(target, model, dimension)
        return target

    def finish_reindex(self, tenant: str, target: str) -> None:
        """Point the alias at the new index in one atomic step, then drop the old one."""
        alias = self.alias(tenant)
        old = self.current_index(tenant)
        actions = [{"add": {"index": target, "alias": alias}}]
        if old:
            actions.insert(0, {"remove": {"index": old, "alias": alias}})
        self._call(lambda: self.es.indices.update_aliases(actions=actions))
        if old and old != target:
            self._call(lambda: self.es.indices.delete(index=old))
        self._ready.discard(alias)

    def close(self) -> None:
        self.es.close()
