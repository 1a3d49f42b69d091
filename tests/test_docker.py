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
    # make demo's install in the build stage (the lock with its hashes, then chartcite without
    # dependencies); the image itself installs the runtime lock and takes the built model files.
    source, models, image = dockerfile.split("\nFROM ")[1:]
    assert source.startswith("python:3.11-slim AS source") and "COPY search search" in source
    assert models.startswith("source AS models") and image.startswith("source\n")
    assert "--require-hashes --no-build-isolation -r requirements/app.lock" in models
    assert "load_embedder(None, 'int8'" in models
    for stage in (models, image):
        assert "--require-hashes -r requirements/build.lock" in stage
        assert "pip install --no-cache-dir --no-deps --no-build-isolation -e ." in stage
    assert "--require-hashes --no-deps --no-build-isolation -r requirements/runtime.lock" in image
    assert "requirements/app.lock" not in image and "COPY --from=models /opt/chartcite-models" in image
    assert "USER chartcite" in image


def test_the_runtime_lock_is_the_app_lock_without_pytorch():
    """requirements/runtime.lock is derived (scripts/runtime_lock.py), never edited: the same
    versions and hashes as the app lock, PyTorch and what only it needs left out."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("runtime_lock", DOCKER.parent / "scripts" / "runtime_lock.py")
    runtime_lock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runtime_lock)
    assert runtime_lock.main(["--check"]) == 0, "run `python scripts/runtime_lock.py`"
    app = (DOCKER.parent / "requirements" / "app.lock").read_text(encoding="utf-8")
    lean = (DOCKER.parent / "requirements" / "runtime.lock").read_text(encoding="utf-8")
    names = lambda text: {line.split("==")[0] for line in text.splitlines() if "==" in line and line[0].isalnum()}
    assert names(app) - names(lean) >= {"torch", "triton", "sentence-transformers"}
    assert {"onnxruntime", "openvino", "tokenizers", "transformers", "spacy"} <= names(lean)
    assert not any(name.startswith(("nvidia-", "cuda-")) for name in names(lean))


WITHOUT_PYTORCH = """
import sys
from pathlib import Path
sys.modules["torch"] = sys.modules["sentence_transformers"] = None      # `import torch` raises ImportError
from search.models.crossrank import CrossEncoderRanker, RerankerNotFound
from search.models.embed import Embedder, ModelNotFound, default_model_path
from search.models.onnx_embed import export
folder = Path(sys.argv[1])
said = []
for attempt in (lambda: export(Path(default_model_path()), folder / "model.onnx"), lambda: Embedder(),
                lambda: CrossEncoderRanker(str(folder))):
    try:
        attempt()
    except (ModelNotFound, RerankerNotFound) as exc:
        said.append(str(exc))
print("\\n".join(said))
"""


def test_without_pytorch_the_parts_that_need_it_refuse_with_a_sentence(tmp_path):
    """What the lean image says when its model files are missing, or fp32 or a reranker is asked
    for. In a process of its own: a library that finds PyTorch missing remembers it."""
    import subprocess
    import sys

    from .conftest import clean_env

    (tmp_path / "config.json").write_text("{}", encoding="utf-8")          # a reranker folder
    out = subprocess.run([sys.executable, "-c", WITHOUT_PYTORCH, str(tmp_path)], cwd=DOCKER.parent,
                         env=clean_env(), capture_output=True, text=True, encoding="utf-8", timeout=300)
    said = out.stdout.splitlines()
    assert len(said) == 3, out.stdout + out.stderr
    assert "building it (once) needs PyTorch" in said[0] and "CHARTCITE_MODEL_CACHE" in said[0]
    assert "fp32 needs PyTorch" in said[1] and "reranker (CHARTCITE_RERANKER) needs PyTorch" in said[2]
