"""A large patient record held as bytes, each resource parsed when it is read.

Parsed, a FHIR resource costs about 13 kB of Python objects (dicts and strings) against about
2 kB of `marshal` bytes (docs/performance.md, "One patient's record in parts"). A record of more
than `LARGE_RECORD` resources is assembled as `CompactResources` (fhir_ingest/record/load.py) and
indexed a part at a time (search/record_parts.py): only the part being chunked, and what its
references resolve to, is parsed at once. A record of fewer stays a plain list of dicts, parsed
once, as before.

The helpers below (`of_types`, `refs_of`, `lookup_of`...) read either form, so the code between
the reader and the index need not know which it holds. `marshal` is this process's own format
for this run only (as in staging.py): several times faster than JSON both ways, and it keeps
every JSON value as it was read.
"""
from __future__ import annotations

import marshal
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence

# Resources above which a patient's record is held compactly and indexed in parts.
LARGE_RECORD = 2_000
# Parsed resources kept for references resolved again and again (a visit many results point
# at), and the largest body worth keeping parsed: a large one (a Binary's scan) is read once.
RECENT = 256
RECENT_BODY = 16_384


def ref_of(resource: dict) -> str:
    return f"{resource['resourceType']}/{resource.get('id')}"


class CompactResources(Sequence):
    """A patient's resources in their order, each held as `marshal` bytes and parsed when read.
    Iterating parses one at a time; a slice parses that part; `lookup` resolves a `Type/id`.
    Read-only but for `append`/`put` while it is being built: a parsed resource handed out is a
    copy, and changing it changes nothing held."""

    def __init__(self, resources: Iterable[dict] = ()):
        self._bodies: list[bytes] = []
        self._types: list[str] = []
        self._refs: list[str] = []
        self._at: dict[str, int] = {}     # Type/id → position (the last copy's, as a dict by ref keeps)
        self._recent: OrderedDict[str, dict] = OrderedDict()
        for resource in resources:
            self.append(resource)

    @classmethod
    def of_bodies(cls, bodies: Iterable[tuple[bytes, str, str]]) -> "CompactResources":
        """From (marshal bytes, resource type, id) already made (staging parks resources so)."""
        held = cls()
        for body, resource_type, rid in bodies:
            held._add(body, resource_type, f"{resource_type}/{rid}")
        return held

    def append(self, resource: dict) -> None:
        self._add(marshal.dumps(resource), resource["resourceType"], ref_of(resource))

    def put(self, resource: dict) -> None:
        """The resource in place of the one held under its `Type/id`, or added at the end."""
        ref = ref_of(resource)
        if ref not in self._at:
            self.append(resource)
            return
        self._bodies[self._at[ref]] = marshal.dumps(resource)
        self._recent.pop(ref, None)

    def _add(self, body: bytes, resource_type: str, ref: str) -> None:
        self._at[ref] = len(self._bodies)
        self._bodies.append(body)
        self._types.append(resource_type)
        self._refs.append(ref)
        self._recent.pop(ref, None)

    def __len__(self) -> int:
        return len(self._bodies)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [marshal.loads(body) for body in self._bodies[index]]
        return marshal.loads(self._bodies[index])

    def __iter__(self) -> Iterator[dict]:
        for body in self._bodies:
            yield marshal.loads(body)

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def __add__(self, more: Iterable[dict]) -> "CompactResources":
        joined = self.only(None)
        for resource in more:
            joined.append(resource)
        return joined

    @property
    def types(self) -> list[str]:
        return list(self._types)

    @property
    def refs(self) -> list[str]:
        return list(self._refs)

    def only(self, types: Iterable[str] | None) -> "CompactResources":
        """The resources of these types (all when None), sharing the bytes held here."""
        wanted = None if types is None else frozenset(types)
        subset = CompactResources()
        for body, resource_type, ref in zip(self._bodies, self._types, self._refs):
            if wanted is None or resource_type in wanted:
                subset._add(body, resource_type, ref)
        return subset

    def of_types(self, types: Iterable[str]) -> Iterator[dict]:
        """The resources of these types in their order, the others left unparsed."""
        wanted = frozenset(types)
        for body, resource_type in zip(self._bodies, self._types):
            if resource_type in wanted:
                yield marshal.loads(body)

    def get(self, ref: str) -> dict | None:
        """The resource held under `Type/id`, or None; the small ones resolved lately kept parsed."""
        if ref in self._recent:
            self._recent.move_to_end(ref)
            return self._recent[ref]
        at = self._at.get(ref)
        if at is None:
            return None
        body = self._bodies[at]
        resource = marshal.loads(body)
        if len(body) <= RECENT_BODY:
            self._recent[ref] = resource
            if len(self._recent) > RECENT:
                self._recent.popitem(last=False)
        return resource

    def has(self, ref: str) -> bool:
        return ref in self._at

    @property
    def lookup(self) -> "CompactLookup":
        return CompactLookup(self)


class CompactLookup(Mapping):
    """`Type/id` → resource over compact resources, as a dict by ref reads over a list: `get`,
    `in`, `[]`, without parsing a resource until it is asked for."""

    def __init__(self, held: CompactResources):
        self._held = held

    def __getitem__(self, ref: str) -> dict:
        resource = self._held.get(ref) if isinstance(ref, str) else None
        if resource is None:
            raise KeyError(ref)
        return resource

    def __contains__(self, ref) -> bool:
        return isinstance(ref, str) and self._held.has(ref)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(self._held.refs))

    def __len__(self) -> int:
        return len(set(self._held.refs))


Resources = Sequence     # a list of dicts or CompactResources


def is_compact(resources) -> bool:
    return isinstance(resources, CompactResources)


def of_types(resources: Resources, types: Iterable[str]) -> Iterator[dict]:
    """The resources of these types, in order (compact ones parsed only when of these types)."""
    if is_compact(resources):
        return resources.of_types(types)
    wanted = frozenset(types)
    return (r for r in resources if r["resourceType"] in wanted)


def only_types(resources: Resources, types: Iterable[str]) -> Resources:
    """The resources of these types, in the form given: a list, or compact resources sharing the bytes."""
    if is_compact(resources):
        return resources.only(types)
    wanted = frozenset(types)
    return [r for r in resources if r["resourceType"] in wanted]


def refs_of(resources: Resources) -> list[str]:
    """Each resource's `Type/id`, in order, without parsing a compact one."""
    return resources.refs if is_compact(resources) else [ref_of(r) for r in resources]


def type_counts(resources: Resources) -> dict[str, int]:
    """Resources per type, in the order each type first appears."""
    return dict(Counter(resources.types if is_compact(resources) else (r["resourceType"] for r in resources)))


def lookup_of(resources: Resources) -> Mapping[str, dict]:
    """`Type/id` → resource: a dict over a list, a parsing view over compact resources."""
    return resources.lookup if is_compact(resources) else {ref_of(r): r for r in resources}


def empty_like(resources: Resources) -> Resources:
    """An empty collection of the same form, for a record rebuilt from this one."""
    return CompactResources() if is_compact(resources) else []


def gathered(resources: Iterable[dict]) -> Resources:
    """Resources read one at a time (a patient's stored record), as a list while there are few
    and compactly once there are more than `LARGE_RECORD`: never more than that many parsed at once."""
    held: Resources = []
    for resource in resources:
        if not is_compact(held) and len(held) >= LARGE_RECORD:
            held = CompactResources(held)
        held.append(resource)
    return held
