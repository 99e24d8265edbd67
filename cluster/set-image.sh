#!/usr/bin/env bash
# Write the image named in cluster/image.env (or given as $1, which is then saved there) into every
# manifest of cluster/, so all of them pull the same image. Idempotent.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [[ $# -ge 1 ]]; then
  sed -i -E "s#^IMAGE=.*#IMAGE=$1#" "$here/image.env"
fi
# shellcheck disable=SC1091
source "$here/image.env"
for f in "$here/ray-cluster-h200.yaml" "$here/rayjob.yaml"; do
  sed -i -E "s#^(\s*(- )?image: )[^ #]+#\1${IMAGE}#" "$f"
done
# the launcher logs in to the image's registry (the part before the first /) before the host pulls it
registry="${IMAGE%%/*}"
sed -i -E "s#(REGISTRY=)[^;]+;#\1${registry};#" "$here/ray-cluster-h200.yaml"
grep -n "image:\|REGISTRY=" "$here"/*.yaml
