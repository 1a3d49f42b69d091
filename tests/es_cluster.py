"""A two-node Elasticsearch cluster on loopback for the failover test, from the distribution
`scripts/services.sh up` installed (CHARTCITE_TEST_ES_HOME). Node 1 is master-eligible and holds
data; node 2 holds data only, so stopping it never costs the cluster its master: what it tests is
shards failing over to their replicas, which is what a hospital's second node is for."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

ES_USER = "chartcite-es"      # Elasticsearch refuses to run as root (scripts/services.sh creates the user)


@dataclass
class Node:
    name: str
    http_port: int
    folder: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def pid(self) -> int:
        return int((self.folder / "data" / "es.pid").read_text(encoding="utf-8"))


def es_home() -> Path:
    home = os.environ.get("CHARTCITE_TEST_ES_HOME", "")
    if not home or not (Path(home) / "bin" / "elasticsearch").exists():
        pytest.fail("no Elasticsearch distribution: run the suite with `make test`, or `eval $(scripts/services.sh up)`")
    return Path(home)


def node_config(node: Node, cluster: str, transport_ports: list[int], master: bool) -> str:
    seeds = ", ".join(f'"127.0.0.1:{p}"' for p in transport_ports)
    return f"""cluster.name: {cluster}
node.name: {node.name}
node.roles: [{'master, data' if master else 'data'}]
path.data: {node.folder / 'data'}
path.logs: {node.folder / 'logs'}
network.host: 127.0.0.1
http.port: {node.http_port}
transport.port: {node.http_port + 100}
discovery.seed_hosts: [{seeds}]
cluster.initial_master_nodes: ["{cluster}-1"]
xpack.security.enabled: false
action.destructive_requires_name: false
cluster.routing.allocation.disk.watermark.low: 2gb
cluster.routing.allocation.disk.watermark.high: 1gb
cluster.routing.allocation.disk.watermark.flood_stage: 512mb
"""


def start_node(home: Path, node: Node, config: str) -> None:
    conf = node.folder / "config"
    shutil.copytree(home / "config", conf)
    (conf / "elasticsearch.yml").write_text(config, encoding="utf-8")
    for sub in ("data", "logs"):
        (node.folder / sub).mkdir(parents=True, exist_ok=True)
    command = [str(home / "bin" / "elasticsearch"), "-d", "-p", str(node.folder / "data" / "es.pid")]
    java = shutil.which("java")
    env = os.environ | {"ES_PATH_CONF": str(conf), "ES_JAVA_OPTS": "-Xms384m -Xmx384m",
                        "ES_JAVA_HOME": os.environ.get("ES_JAVA_HOME") or str(Path(os.path.realpath(java)).parent.parent)}
    if os.geteuid() == 0:
        subprocess.run(["chown", "-R", ES_USER, str(node.folder)], check=True)
        command = ["runuser", "-u", ES_USER, "--", "env", *[f"{k}={env[k]}" for k in ("ES_PATH_CONF", "ES_JAVA_OPTS",
                                                                                      "ES_JAVA_HOME")], *command]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180, encoding="utf-8")
    if out.returncode != 0:
        raise RuntimeError(f"{node.name} did not start: {out.stdout[-2000:]} {out.stderr[-2000:]}")


def start_cluster(folder: Path, first_port: int, cluster: str) -> list[Node]:
    home = es_home()
    nodes = [Node(f"{cluster}-{i + 1}", first_port + i, folder / f"node{i + 1}") for i in range(2)]
    transports = [n.http_port + 100 for n in nodes]
    for i, node in enumerate(nodes):
        folder.mkdir(parents=True, exist_ok=True)
        start_node(home, node, node_config(node, cluster, transports, master=i == 0))
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            health = requests.get(f"{nodes[0].url}/_cluster/health", params={"wait_for_nodes": "2", "timeout": "1s"},
                                  timeout=5).json()
            if health.get("number_of_nodes") == 2:
                return nodes
        except requests.RequestException:
            pass
        time.sleep(1)
    raise RuntimeError("the two-node cluster did not form: see " + str(folder))


def kill(node: Node, sig: int = signal.SIGKILL) -> None:
    try:
        os.kill(node.pid, sig)
    except (OSError, ValueError):
        return
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            os.kill(node.pid, 0)
        except OSError:
            return
        time.sleep(0.2)
