#!/usr/bin/env bash
# Checks that ferrepl still compiles (lib, binary, tests, benches) for macOS,
# where most agent users are: Linux-only code must stay behind
# cfg(target_os = "linux"). Type-checks only; nothing is linked or run.
set -euo pipefail
cd "$(dirname "$0")/.."

target=x86_64-apple-darwin
if ! rustup target list --installed | grep -qx "$target"; then
    rustup target add "$target" >&2
fi
# The bundled SQLite and ring's C are compiled by their build scripts even
# for a check; the host's gcc builds them once Apple's flags (-arch,
# -mmacosx-version-min, clang's -gfull) are dropped (the objects are never
# linked).
cc="$PWD/target/macos-check-cc"
mkdir -p target
cat >"$cc" <<'CC'
#!/usr/bin/env bash
args=()
skip=0
for a in "$@"; do
    if (( skip )); then skip=0; continue; fi
    case "$a" in
        -arch) skip=1 ;;
        -mmacosx-version-min=*) ;;
        -gfull) ;;
        *) args+=("$a") ;;
    esac
done
exec cc "${args[@]}"
CC
chmod +x "$cc"
CC_x86_64_apple_darwin="$cc" AR_x86_64_apple_darwin=ar \
    cargo clippy --quiet --target "$target" --all-targets -- -D warnings
