#!/usr/bin/env bash
# Writes the Kubernetes manifests for a job of N ranks (docs/deploy.md, "Kubernetes") to
# standard output: service.yaml and job.yaml with the rank count and the image set.
#   deploy/k8s/render.sh --ranks 16 --image registry.example/loom:1.0 | kubectl apply -f -
set -euo pipefail
ranks=2 image=loom:latest
while [ $# -gt 0 ]; do
  case $1 in
    --ranks) ranks=$2; shift 2 ;;
    --image) image=$2; shift 2 ;;
    *) echo "render.sh: unknown argument '$1' (expected --ranks N, --image IMAGE)" >&2; exit 2 ;;
  esac
done
[[ $ranks =~ ^[1-9][0-9]*$ ]] || { echo "render.sh: --ranks '$ranks': expected a positive count" >&2; exit 2; }
[[ $image =~ ^[A-Za-z0-9./:_@-]+$ ]] || { echo "render.sh: --image '$image': expected an image reference" >&2; exit 2; }
dir=$(dirname "$0")
cat "$dir/service.yaml"
echo "---"
sed -e "s/^  completions: 2$/  completions: $ranks/" -e "s/^  parallelism: 2$/  parallelism: $ranks/" \
    -e "/name: WORLD_SIZE/{n;s/value: \"2\"/value: \"$ranks\"/}" -e "s#image: loom:latest#image: $image#" "$dir/job.yaml"
