"""How to reach an Elasticsearch cluster, apart from the client: commands and the embedded
default import this without paying for the Elasticsearch client's import (most of a second)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ElasticOptions:
    """How to reach the cluster and how to shape new indices (CHARTCITE_ES_* settings)."""
    urls: tuple[str, ...] = ()
    api_key: str = field(default="", repr=False)      # credentials never appear in a repr or a traceback
    username: str = ""
    password: str = field(default="", repr=False)
    ca_certs: str = ""
    verify_certs: bool = True
    shards: int = 1
    replicas: int = 0

    def connection(self) -> dict:
        """The keyword arguments of ElasticsearchBackend besides the URLs."""
        return {"api_key": self.api_key, "username": self.username, "password": self.password,
                "ca_certs": self.ca_certs, "verify_certs": self.verify_certs, "shards": self.shards,
                "replicas": self.replicas}
