#!/bin/sh
# The container's entry point: `loom ARGS`, as PID 1 (so that SIGTERM reaches it and it
# saves before the container stops), after one check: `train` writes its run directory
# (/work/runs by default; LOOM_RUNS names another) into a mounted volume, never into the
# container's own layer, which is lost with the container.
runs=${LOOM_RUNS:-/work/runs}
if [ "${1:-}" = train ] && ! mountpoint -q "$runs"; then
  echo "loom (container): $runs is not a mounted volume: the run's checkpoints and metrics would be lost with the container; run with -v HOST_DIR:$runs (or set LOOM_RUNS to the mount and --job.run_dir to it)" >&2
  exit 2
fi
exec /usr/local/bin/loom "$@"
