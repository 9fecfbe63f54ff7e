#!/usr/bin/env bash
# The container image for real: a Debian 12 base made here (no registry is reachable), the image
# of deploy/Dockerfile built with podman from the committed tree, then a 2-container training job
# (train_fashion_mnist, one container per node, host network) through `dtrain submit --engine
# local --container` (tests/launch/submit_test.cc, LocalQueue.ATwoContainerTrainingJobOnPodman).
#   scripts/container-test.sh            # as root; build/ must hold the built tests
# About 20 minutes on 2 cores (the image installs the build packages and compiles dtrain): a
# separate command, not part of .ci/run. Exits 0 with a message where containers cannot run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
work=${DTRAIN_IMAGE_WORK:-/var/tmp/dtrain-image}
image=localhost/dtrain:latest

if [ "$(id -u)" -ne 0 ]; then
  echo "container-test: skipped: needs root (rootful podman with host networking)"; exit 0
fi
if ! command -v podman >/dev/null || ! command -v debootstrap >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    podman runc debootstrap >/dev/null
fi
mkdir -p "$work"
# Debian's podman on these machines: runc and cgroupfs (no systemd), and no default ulimits
# (the sandbox does not let a container raise them).
cat > "$work/containers.conf" <<'CONF'
[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
CONF
export CONTAINERS_CONF=$work/containers.conf
if ! podman info >/dev/null 2>&1; then
  echo "container-test: skipped: podman cannot run here ($(podman info 2>&1 | tail -1))"; exit 0
fi

if ! podman image exists localhost/debian:bookworm; then
  echo "container-test: debootstrap a minimal Debian 12 into $work/rootfs"
  rm -rf "$work/rootfs"
  debootstrap --variant=minbase bookworm "$work/rootfs" http://deb.debian.org/debian >/dev/null
  tar -C "$work/rootfs" -c . | podman import - localhost/debian:bookworm
fi
podman tag localhost/debian:bookworm docker.io/library/debian:12  # the Dockerfile's FROM

echo "container-test: building $image from deploy/Dockerfile (the committed tree: git archive HEAD)"
rm -rf "$work/src" && mkdir -p "$work/src"
git -C "$root" archive HEAD | tar -x -C "$work/src"
podman build --network host -f deploy/Dockerfile -t "$image" "$work/src"

echo "container-test: one container, two ranks"
podman run --rm --network host --ipc host "$image" \
  dtrain run -n 2 -- train_fashion_mnist --max-steps 20 --threads 1 | grep RESULT

echo "container-test: two containers through dtrain submit --engine local --container"
DTRAIN_TEST_IMAGE=$image "$build/bin/submit_test" \
  --gtest_filter='LocalQueue.ATwoContainerTrainingJobOnPodman'
