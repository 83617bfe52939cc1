# Sourced by the training benchmarks after they cd to the project root: the release loom
# (built if missing), the fortunes token file (prepared if missing), and a scratch
# directory $work removed on exit.
loom=build/release/loom
[ -x $loom ] || { cmake --preset release >/dev/null && cmake --build --preset release --target loom; }
[ -f data/fortunes.bin ] || $loom data prepare text:/usr/share/games/fortunes --out data/fortunes.bin
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
