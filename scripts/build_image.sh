#!/usr/bin/env bash
# Build the dpsynth images with buildah (no Docker engine) and, given a registry, push them.
#
#   scripts/build_image.sh                      # the CPU stage image on a debootstrap base (cached) + a smoke run
#   REGISTRY=registry.example.org/ml scripts/build_image.sh all --push
#                                               # every image the chart, the runbook and the KFP YAML name (IMAGES),
#                                               # on their Dockerfiles' own bases, tagged REGISTRY/NAME and pushed
#
# IMAGES is the one list of the tags the deployment uses (docs/cluster.md; tests/deploy/test_cluster_runbook.py
# checks that every image the chart, values-*.yaml, the runbook and the compiled KFP pipeline name is in it).
# `all` needs the base images' registries (docker.io) and PyPI / the PyTorch index; the default build below is the
# one made without a registry. Container storage lives in .containers/ (vfs driver, chroot isolation), as
# ENVIRONMENT.md found to work on these machines. Needs root, buildah, podman, runc and debootstrap.
# The torch CPU wheel comes from WHEELS (default /opt/wheels) when that directory exists, else from
# the PyTorch CPU index. The smoke run imports the bundled MNIST and runs `dpsynth partition` and
# `dpsynth privacy epsilon` inside the image, with the repository's data mounted read-only.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGES=(
  "dpsynth-stage:cpu images/stage-cpu.Dockerfile"
  "dpsynth-stage:cuda images/stage-cuda.Dockerfile"
  "dpsynth-airflow:3.3.2 images/airflow.Dockerfile"
)
ROOT=$PWD/.containers
ST=(--storage-driver vfs --root "$ROOT/storage" --runroot "$ROOT/run")
GIT_SHA=$(git rev-parse HEAD 2>/dev/null || echo unknown)
mkdir -p "$ROOT"

if [ "${1:-}" = all ]; then
  command -v buildah >/dev/null || { echo "build_image: buildah is not installed" >&2; exit 2; }
  push=${2:-}
  if [ -n "$push" ] && [ "$push" != --push ]; then echo "build_image: usage: $0 all [--push]" >&2; exit 2; fi
  if [ -n "$push" ] && [ -z "${REGISTRY:-}" ]; then echo "build_image: --push needs REGISTRY" >&2; exit 2; fi
  for entry in "${IMAGES[@]}"; do
    read -r name dockerfile <<<"$entry"
    tag=${REGISTRY:+${REGISTRY%/}/}$name
    echo "== buildah bud $dockerfile -> $tag"
    buildah "${ST[@]}" bud --layers --isolation chroot --build-arg "GIT_SHA=$GIT_SHA" -f "$dockerfile" -t "$tag" .
    if [ -n "$push" ]; then
      buildah "${ST[@]}" push "$tag" "docker://$tag"
    fi
  done
  exit 0
fi

BASE=localhost/debian-python:bookworm
IMAGE=${IMAGE:-localhost/dpsynth-stage:cpu}
WHEELS=${WHEELS:-/opt/wheels}
MIRROR=${MIRROR:-http://deb.debian.org/debian}

for tool in buildah podman runc debootstrap; do
  command -v "$tool" >/dev/null || { echo "build_image: $tool is not installed (apt-get install podman buildah runc debootstrap)" >&2; exit 2; }
done

if ! buildah "${ST[@]}" inspect --type image "$BASE" >/dev/null 2>&1; then
  if [ ! -f "$ROOT/rootfs.tar" ]; then
    echo "== debootstrap: Debian bookworm minbase with python3 ($MIRROR)"
    rm -rf "$ROOT/rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
      bookworm "$ROOT/rootfs" "$MIRROR" >"$ROOT/debootstrap.log"
    tar -C "$ROOT/rootfs" -cf "$ROOT/rootfs.tar.part" . && mv "$ROOT/rootfs.tar.part" "$ROOT/rootfs.tar"
    rm -rf "$ROOT/rootfs"
  fi
  printf 'FROM scratch\nADD rootfs.tar /\nCMD ["bash"]\n' >"$ROOT/Containerfile.base"
  buildah "${ST[@]}" bud --isolation chroot -f "$ROOT/Containerfile.base" -t "$BASE" "$ROOT"
fi

args=(--build-arg "BASE_IMAGE=$BASE" --build-arg "GIT_SHA=$GIT_SHA")
CA=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}  # the host's trust store (TLS-intercepting proxies)
if [ -f "$CA" ]; then
  args+=(-v "$CA:/host-ca.crt:ro" --build-arg PIP_CERT=/host-ca.crt)
fi
if [ -d "$WHEELS" ]; then
  args+=(-v "$WHEELS:/wheels:ro" --build-arg PIP_FIND_LINKS=/wheels --build-arg TORCH_INDEX_URL=https://pypi.org/simple)
fi
echo "== buildah bud images/stage-cpu.Dockerfile -> $IMAGE"
buildah "${ST[@]}" bud --layers --isolation chroot "${args[@]}" -f images/stage-cpu.Dockerfile -t "$IMAGE" .

echo "== smoke run in $IMAGE"
OUT=$(mktemp -d "$ROOT/smoke.XXXXXX")
chmod 777 "$OUT"
# One container for the whole smoke run: with the vfs driver every container is a full copy of the image.
podman "${ST[@]}" --runtime runc --cgroup-manager cgroupfs run --rm --network none \
  --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 -v "$PWD/data/mnist:/data:ro" -v "$OUT:/out" \
  --entrypoint sh "$IMAGE" -c '
    set -e
    dpsynth data import /data /out/mnist.parquet
    dpsynth partition --run-dir /out/run --set data.uri=/out/mnist.parquet --set partition.num_shards=2 \
      --set tracking.enabled=false --json > /out/partition.json
    dpsynth privacy epsilon --noise-multiplier 1.0 --sample-rate 0.0021333 --steps 450000 --delta 1e-5'
python3 - "$OUT/partition.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["manifest"]
shards = [o for o in m["outputs"] if o["role"] == "shard"]
assert m["status"] == "succeeded" and len(shards) == 2, m
print(f"partition in the image: {m['details']['records']} records -> {len(shards)} shards + held-out")
PY
echo "== ok: $(buildah "${ST[@]}" images --format '{{.Name}}:{{.Tag}} {{.Size}}' "$IMAGE")"
