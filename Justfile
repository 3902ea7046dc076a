# flywheel — the two commands a newcomer needs are `just demo` and `just test`.
# Every recipe bootstraps .venv first (idempotent; a no-op in well under a second once set up).

set shell := ["bash", "-euo", "pipefail", "-c"]

venv := ".venv"
py := venv / "bin/python"

# Show the recipes.
default:
    @just --list

# Run the main job: the embedded default topology (embedded NATS, tiny GPT, three domains).
demo *ARGS: bootstrap
    {{py}} -m topology.cli up specs/embedded.yaml {{ARGS}}

# Run the test suite (real nats-server, real sandbox, real torch models).
test *ARGS: bootstrap
    {{py}} -m pytest -q -n 2 --dist loadgroup {{ARGS}}

# The suite N times in a row beside a CPU hog (a busy loop per core), stopping at a failure: `just stress 5`.
stress N="5" *ARGS: bootstrap
    #!/usr/bin/env bash
    set -euo pipefail
    hogs=()
    for _ in $(seq "$(nproc)"); do "{{py}}" -c 'while True: pass' & hogs+=($!); done
    trap 'kill "${hogs[@]}" 2>/dev/null || true' EXIT
    for run in $(seq {{N}}); do
        echo "flywheel: stress run $run of {{N}}, beside ${#hogs[@]} busy loops ($(date +%H:%M:%S))" >&2
        if ! "{{py}}" -m pytest -q -n 2 --dist loadgroup {{ARGS}}; then
            echo "flywheel: stress run $run of {{N}} FAILED" >&2
            exit 1
        fi
    done
    echo "flywheel: {{N}} consecutive passes beside ${#hogs[@]} busy loops" >&2

# Kill -9 soak of a real run (each actor, nats-server, the whole tree + --resume); `just soak --service --quick`.
soak *ARGS: bootstrap
    {{py}} bench/soak.py {{ARGS}}

# ruff (format and lint), mypy (strict on topology/ and actors/), and the import contracts (the layering).
lint: bootstrap
    {{venv}}/bin/ruff format --check .
    {{venv}}/bin/ruff check .
    {{venv}}/bin/mypy
    {{venv}}/bin/lint-imports --no-cache

# Benchmarks; each writes bench/results/<name>.json and prints a markdown table. `just bench --quick`.
bench *ARGS: bootstrap
    for b in bus sandbox generate weights replay; do \
        if [ -f bench/$b.py ]; then {{py}} bench/$b.py {{ARGS}}; fi; \
    done

# (bench/users.py: served accuracy over time, feedback-to-serving latency, promotions and rollbacks, the three ledgers;
# `just users --quick` takes about 90 s, `--duration 600 --kill` is the full run.)
# Simulated users of the always-on service (specs/service.yaml) through the official openai client.
users *ARGS: bootstrap
    {{py}} bench/users.py {{ARGS}}

# Check every example spec.
validate: bootstrap
    {{py}} -m topology.cli validate specs/*.yaml

# Create or refresh .venv: torch 2.13.0 (CPU build when there is no GPU), the project with extras, bubblewrap.
bootstrap:
    #!/usr/bin/env bash
    set -euo pipefail
    stamp="{{venv}}/.flywheel-bootstrap"
    want="$(cat pyproject.toml Justfile | sha256sum | cut -c1-16)"
    if [ -x "{{py}}" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then exit 0; fi
    echo "flywheel: setting up {{venv}} (first run only; a few minutes)" >&2
    python="${PYTHON:-$(command -v python3.11 || command -v python3)}"
    "$python" -c 'import sys; assert sys.version_info >= (3, 11), "flywheel needs Python >= 3.11, found " + sys.version' 
    [ -x "{{py}}" ] || "$python" -m venv "{{venv}}"
    pip_install() {  # quiet, minus the machine's notes about local index folders it cannot find
        "{{py}}" -m pip install --quiet --disable-pip-version-check "$@" 2>&1 | { grep -v "is ignored: it is neither" || true; }
        return "${PIPESTATUS[0]}"
    }
    if ! "{{py}}" -c 'import torch' 2>/dev/null; then
        if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
            echo "flywheel: GPU found: installing torch 2.13.0 (CUDA build)" >&2
        else
            echo "flywheel: no GPU: installing torch 2.13.0 (CPU build where one is available locally)" >&2
        fi
        pip_install "torch==2.13.0"
    fi
    pip_install -e ".[dev,hf,ray]"
    if ! command -v bwrap >/dev/null 2>&1; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            echo "flywheel: installing bubblewrap (the sandbox's isolation) with apt-get" >&2
            (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap) >/dev/null \
                || echo "flywheel: WARNING: could not install bubblewrap; the sandbox falls back to weaker isolation" >&2
        else
            echo "flywheel: WARNING: bubblewrap (bwrap) is missing; install it (e.g. 'sudo apt-get install bubblewrap')," >&2
            echo "          or the sandbox falls back to weaker isolation and says so" >&2
        fi
    fi
    echo "$want" > "$stamp"
    echo "flywheel: {{venv}} ready" >&2
