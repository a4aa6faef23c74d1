# Sourced by scripts/serve and scripts/test: make .venv and install the project into it, saying what
# it is doing. `ensure_venv WHO [EXTRAS]` (EXTRAS: e.g. `[test]`) reinstalls only when pyproject.toml
# changed since the last successful install for WHO (the stamp is a copy of the pyproject.toml that
# was installed, kept inside .venv so a fresh venv always installs). pip's output goes to
# .venv/pip-install.log, shown in full when the install fails; meanwhile a line every few seconds
# says how long it has run and what pip is at.

TICK_SECONDS=${HORDE_LITE_INSTALL_TICK:-5}

# Python keeps what it compiles (and pytest its rewritten test modules) in __pycache__ beside the
# sources (git ignores them), even where the environment asks it to write no bytecode: without it
# every process (each test worker, each server and CLI a test starts) compiles the project and the
# tests again, seconds each time. pip compiles the installed packages into .venv either way.
unset PYTHONDONTWRITEBYTECODE

_say() { echo "scripts/$1: $2" >&2; }

ensure_venv() {
    local who=$1 extras=${2:-} repo
    repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    local venv="$repo/.venv" log="$repo/.venv/pip-install.log"
    local stamp="$venv/.horde-lite-installed-$who.pyproject.toml"
    if [ ! -x "$venv/bin/python" ]; then
        _say "$who" "creating $venv (python: ${PYTHON:-python3})"
        "${PYTHON:-python3}" -m venv "$venv"
    fi
    cmp -s "$repo/pyproject.toml" "$stamp" && return 0
    local expected="about a minute"
    # llama-cpp-python builds llama.cpp from source the first time (pip caches the wheel afterwards).
    if [ "$extras" = "[model]" ]; then
        expected="about 5 minutes, llama.cpp builds from source"
    fi
    _say "$who" "installing horde_lite$extras and its dependencies into .venv (first time: $expected; log: $log)"
    local started=$SECONDS
    "$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar off -e "$repo$extras" \
        >"$log" 2>&1 &
    local pip=$!
    while kill -0 "$pip" 2>/dev/null; do
        # Sleep in short steps so a quick install is not held up for a whole tick.
        local waited=0
        while [ "$waited" -lt "$TICK_SECONDS" ] && kill -0 "$pip" 2>/dev/null; do
            sleep 1
            waited=$((waited + 1))
        done
        if kill -0 "$pip" 2>/dev/null; then
            local at
            at=$(grep -E '^(Collecting|Downloading|Building|Installing|Requirement|Obtaining)' "$log" | tail -n 1 | cut -c1-90)
            _say "$who" "  ... $((SECONDS - started)) s${at:+: $at}"
        fi
    done
    if ! wait "$pip"; then
        cat "$log" >&2
        _say "$who" "pip install -e '.$extras' failed after $((SECONDS - started)) s (pip's log above, kept in $log)"
        exit 1
    fi
    _say "$who" "installed in $((SECONDS - started)) s"
    cp "$repo/pyproject.toml" "$stamp"
}
