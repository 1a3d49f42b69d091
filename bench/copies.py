"""Copies of the shared Synthea records with ids of their own, for benches that need more patients
(or a larger record) than the shared set holds."""
from __future__ import annotations

import gzip
import json
import re
import uuid
from pathlib import Path

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def copied_bundle_json(source: Path, copy: int) -> dict:
    """The bundle with every resource id replaced by one of this copy's own (the same old id always
    becomes the same new one, so references follow); copy 0 keeps the originals."""
    with gzip.open(source, "rt", encoding="utf-8") as fh:
        text = fh.read()
    if copy:
        ids = {e["resource"]["id"] for e in json.loads(text)["entry"] if e.get("resource", {}).get("id")}
        text = UUID.sub(lambda m: str(uuid.uuid5(uuid.NAMESPACE_URL, f"{copy}/{m.group(0)}"))
                        if m.group(0) in ids else m.group(0), text)
    return json.loads(text)
