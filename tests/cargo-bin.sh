# shellcheck shell=bash
# Where cargo puts this workspace's binaries: asks cargo rather than assuming
# target/, so CARGO_TARGET_DIR, build.target-dir and the like are honoured.
# Source it, then:
#   bin=$(cargo_bin tinkerbox tinkerbox)          # builds (debug) if needed
#   gen=$(cargo_bin --release dhcpgen dhcpgen)    # builds (release) if needed
#   bin=$(cargo_build_bin tinkerbox --locked --all-targets)   # any build
#   dir=$(cargo_target_dir)                       # builds nothing
# Needs cargo and python3 (tests/deps installs python3).

# The workspace root (this file is in its tests/); cargo runs from there so
# that the workspace's .cargo/config.toml, if any, applies as before.
TB_CARGO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# cargo_build_bin BIN CARGO-BUILD-ARG... : cargo build CARGO-BUILD-ARG...
# (cargo's own output on stderr), then prints the path of the executable of
# binary target BIN (not its test harness) from cargo's compiler-artifact
# message. For a build that must stay as it is, e.g. tests/run's
# `--all-targets` one: a narrower build (-p, --bin) may resolve other
# features and rebuild the binary.
cargo_build_bin() {
    local name=${1:?usage: cargo_build_bin BIN CARGO-BUILD-ARG...}
    shift
    local exe
    exe=$(
        set -o pipefail
        cd "$TB_CARGO_ROOT" &&
            cargo build --message-format=json-render-diagnostics "$@" |
            python3 -c '
import json, sys
exe = ""
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    t = m.get("target") or {}
    if (m.get("reason") == "compiler-artifact" and t.get("name") == sys.argv[1]
            and "bin" in t.get("kind", []) and not (m.get("profile") or {}).get("test")
            and m.get("executable")):
        exe = m["executable"]
print(exe)
' "$name"
    ) || {
        echo "cargo_build_bin: cargo build $* failed" >&2
        return 1
    }
    if [[ -z $exe || ! -x $exe ]]; then
        echo "cargo_build_bin: cargo build $* reported no executable for binary $name" >&2
        return 1
    fi
    printf '%s\n' "$exe"
}

# cargo_bin [--release] PACKAGE BIN : builds binary BIN of workspace package
# PACKAGE (cargo build --locked [--release] -p PACKAGE --bin BIN) and prints
# where cargo put it.
cargo_bin() {
    local -a release=()
    if [[ ${1:-} == --release ]]; then
        release=(--release)
        shift
    fi
    local pkg=${1:?usage: cargo_bin [--release] PACKAGE BIN} name=${2:?usage: cargo_bin [--release] PACKAGE BIN}
    cargo_build_bin "$name" --locked "${release[@]}" -p "$pkg" --bin "$name"
}

# cargo_target_dir : prints the workspace's target directory (cargo metadata),
# for the binaries of a build made earlier: "$(cargo_target_dir)/debug/tinkerbox".
cargo_target_dir() {
    (
        set -o pipefail
        cd "$TB_CARGO_ROOT" &&
            cargo metadata --locked --format-version 1 --no-deps |
            python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])'
    ) || {
        echo "cargo_target_dir: cargo metadata failed" >&2
        return 1
    }
}
