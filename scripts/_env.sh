# Sourced by the scripts: find Python 3.13, create .venv if missing, install the project.
# Usage: source scripts/_env.sh [extras]   (extras: "", "test" or "test,dev")
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"

find_python313() {
  local candidates=()
  command -v python3.13 >/dev/null 2>&1 && candidates+=("$(command -v python3.13)")
  if command -v pyenv >/dev/null 2>&1; then
    local prefix
    prefix="$(pyenv prefix 3.13 2>/dev/null || true)"
    [ -z "$prefix" ] && prefix="$(PYENV_VERSION=3.13.0 pyenv prefix 2>/dev/null || true)"
    [ -n "$prefix" ] && candidates+=("$prefix/bin/python3")
    for d in "$(pyenv root 2>/dev/null)"/versions/3.13*; do
      [ -x "$d/bin/python3" ] && candidates+=("$d/bin/python3")
    done
  fi
  for c in "${candidates[@]}"; do
    if "$c" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 13) else 1)' 2>/dev/null; then
      echo "$c"; return 0
    fi
  done
  return 1
}

# One line per install step, on stderr (stdout stays the daemon's).
step() {
  echo "==> $*" >&2
}

ensure_venv() {
  local extras="${1:-}"
  if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 13) else 1)' 2>/dev/null; then
    local py
    if ! py="$(find_python313)"; then
      echo "acp-serve needs Python 3.13 (quart-trio 0.13 and quart 0.23 require it)." >&2
      echo "Install it (e.g. 'pyenv install 3.13.0') or put python3.13 on PATH, then retry." >&2
      exit 1
    fi
    rm -rf "$VENV"
    step "creating $VENV with $py"
    "$py" -m venv "$VENV"
  fi
  local spec="."
  [ -n "$extras" ] && spec=".[$extras]"
  local stamp="$VENV/.installed-$(echo "$extras" | tr ',' '-')"
  if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
    step "installing acp-serve${extras:+ with [$extras]} and its dependencies into $VENV (pip; ~30 s the first time)"
    # pip's own lines (what it collects, downloads and installs) show the progress.
    "$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar on -e "$ROOT$([ -n "$extras" ] && echo "[$extras]")" 2>&1 \
      | grep --line-buffered -v -e "is ignored: it is neither a file nor a directory" -e "^Requirement already satisfied" >&2 || true
    "$VENV/bin/python" -c 'import serve, trio, quart_trio, msgspec' || { echo "install failed" >&2; exit 1; }
    touch "$stamp"
    step "installed"
  fi
  # Byte-compile our own packages (an editable install does not; start-up then never
  # compiles them, even where PYTHONDONTWRITEBYTECODE is set). Cheap when up to date.
  "$VENV/bin/python" -m compileall -q "$ROOT/serve" "$ROOT/actors" "$ROOT/acp" >/dev/null || true
}
