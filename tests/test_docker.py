"""Docker cannot run here, so the deployment files are checked for what can be checked."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

from smart_app.cli import build_parser

DOCKER = Path(__file__).resolve().parent.parent / "docker"


def commands_of_parser() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return set(sub.choices)


def test_compose_file_parses_and_wires_the_services():
    compose = yaml.safe_load((DOCKER / "docker-compose.yml").read_text(encoding="utf-8"))
    services = compose["services"]
    assert {"app", "worker", "beat", "redis", "elasticsearch"} <= set(services)
    for name in ("app", "worker", "beat"):
        env = services[name]["environment"]
        assert env["CHARTCITE_BACKEND"] == "elasticsearch" and env["CHARTCITE_REDIS_URL"].startswith("redis://")
        assert "chartcite-data:/data" in services[name]["volumes"]
    for name in ("redis", "elasticsearch", "app", "worker"):
        assert "healthcheck" in services[name]
    assert set(compose["volumes"]) >= {"chartcite-data", "es-data", "redis-data"}
    assert services["elasticsearch"]["image"].endswith(":8.19.5")        # the major the client is pinned to


def test_container_commands_are_real_cli_commands():
    commands = commands_of_parser()
    compose = yaml.safe_load((DOCKER / "docker-compose.yml").read_text(encoding="utf-8"))
    for service in compose["services"].values():
        command = service.get("command")
        if command and command[0] == "chartcite":
            assert command[1] in commands
    dockerfile = (DOCKER / "Dockerfile").read_text(encoding="utf-8")
    cmd = re.search(r'^CMD \["chartcite", "(\w+)"', dockerfile, re.M)
    assert cmd and cmd.group(1) in commands
    assert "--dev" not in dockerfile                                 # the image serves with gunicorn
    # make demo's install, in the image: the lock with its hashes, then chartcite without dependencies
    assert "--require-hashes -r requirements/build.lock" in dockerfile
    assert "--require-hashes --no-build-isolation -r requirements/app.lock" in dockerfile
    assert "pip install --no-cache-dir --no-deps --no-build-isolation -e ." in dockerfile
    assert "USER chartcite" in dockerfile
