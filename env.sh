# labkit environment: `source env.sh`
# Creates/activates .venv, installs the project (with the test extra), exports LAB_ROOT, RUNS_DIR,
# MODEL_DIR and the NCCL/NVLink-multicast safety variables. Safe to source interactively: it never
# exits the shell and leaves no `set -e` behind; when everything is installed it is quick and quiet.

_labkit_env() {
    local here
    here="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)" || return 1
    export LAB_ROOT="$here"
    export RUNS_DIR="${RUNS_DIR:-$LAB_ROOT/runs}"
    export LABKIT_CACHE="${LABKIT_CACHE:-$HOME/.cache/labkit}"
    # The embedded default model; labkit makes it on first use when this folder is missing.
    export MODEL_DIR="${MODEL_DIR:-$LABKIT_CACHE/models/tiny-seed0}"
    # Never let NCCL / torch / NVSHMEM use NVLink multicast (it can take shared GPUs down).
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    export NCCL_CUMEM_ENABLE="${NCCL_CUMEM_ENABLE:-0}"
    export TOKENIZERS_PARALLELISM="${TOKENIZERS_PARALLELISM:-false}"
    export HF_HUB_DISABLE_TELEMETRY=1

    local venv="$LAB_ROOT/.venv" py="${LABKIT_PYTHON:-python3}"
    local stamp="$venv/.labkit-installed"
    local want start=$SECONDS
    want="$(cat "$LAB_ROOT/pyproject.toml" 2>/dev/null | cksum | cut -d' ' -f1)"
    if [ ! -x "$venv/bin/python" ]; then
        # The first run installs everything; say what and for how long (pip itself runs quietly).
        echo "labkit: first-time setup: a virtual environment in $venv with torch, triton, transformers and the" \
             "test tools (about 2.5 GB on disk; ~3 minutes on 2 cores with a fast network)." \
             "Later \`source env.sh\` runs take a second." >&2
        echo "labkit: creating $venv" >&2
        # Where the base Python already has torch (a GPU box's image), reuse it instead of
        # downloading another build.
        if "$py" -c "import torch" >/dev/null 2>&1; then
            "$py" -m venv --system-site-packages "$venv" || { echo "labkit: venv creation failed" >&2; return 1; }
        else
            "$py" -m venv "$venv" || { echo "labkit: venv creation failed" >&2; return 1; }
        fi
    fi
    # shellcheck disable=SC1091
    . "$venv/bin/activate" || return 1
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        if ! python -c "import torch" >/dev/null 2>&1; then
            echo "labkit: installing torch ${LABKIT_TORCH_VERSION:-2.13.0} (~1 minute)" >&2
            # The CPU build: a plain `torch` would pull several GB of CUDA wheels.
            python -m pip install -q "torch==${LABKIT_TORCH_VERSION:-2.13.0}" \
                || { echo "labkit: could not install torch (set LABKIT_TORCH_VERSION or install torch into .venv)" >&2; return 1; }
        fi
        echo "labkit: installing labkit into $venv with triton (~1 GB), transformers, fastapi, matplotlib," \
             "pytest, ... (first time or pyproject.toml changed; ~2 minutes the first time)" >&2
        python -m pip install -q -e "$LAB_ROOT[test]" --config-settings editable_mode=compat || { echo "labkit: pip install failed" >&2; return 1; }
        echo "$want" > "$stamp"
        echo "labkit: environment ready in $((SECONDS - start)) s" >&2
    fi
    mkdir -p "$RUNS_DIR" 2>/dev/null
    return 0
}
_labkit_env
_labkit_rc=$?
unset -f _labkit_env
[ "$_labkit_rc" -eq 0 ] || echo "labkit: env.sh did not finish (see above)" >&2
unset _labkit_rc
true
