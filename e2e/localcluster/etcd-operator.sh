#!/usr/bin/env bash
# Builds etcd-io/etcd-operator from a checkout of its source, packs its image without Docker and
# renders its install manifest (its own config/default, with that image), for `make bench-peers`.
# Its module (go.etcd.io/etcd-operator) is not served by the Go module proxy, so the source is
# given; its dependencies come through the proxy like ours.
#
#   etcd-operator.sh SRC OUTDIR KUBECTL   → OUTDIR/etcd-operator.tar, OUTDIR/install.yaml,
#                                           and the version it built on stdout
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$1" && pwd) out=$2 kubectl=$3
image=kvcluster.io/etcd-operator:bench
grep -qx 'module go.etcd.io/etcd-operator' "$src/go.mod" ||
  { echo "etcd-operator.sh: $src is not a checkout of etcd-io/etcd-operator (go.mod names another module)" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
(cd "$src" && CGO_ENABLED=0 go build -trimpath -o "$out/manager" ./cmd) >&2
(cd "$here/../.." && go run ./e2e/localcluster/imgpack -tag "$image" -out "$out/etcd-operator.tar" \
  -file "$out/manager=/manager" -entrypoint /manager -user 65532:65532) >&2
# An overlay on its own kustomization swaps in the image; kustomize takes only relative paths.
overlay=$(mktemp -d "$out/overlay.XXXXXX")
trap 'rm -rf "$overlay"' EXIT
cat > "$overlay/kustomization.yaml" <<EOF
resources:
- $(realpath --relative-to="$overlay" "$src/config/default")
images:
- name: etcd-operator
  newName: ${image%:*}
  newTag: ${image##*:}
EOF
"$kubectl" kustomize "$overlay" > "$out/install.yaml"
grep -q "image: $image\$" "$out/install.yaml" ||
  { echo "etcd-operator.sh: the rendered manifest does not run $image (did its config/ change?)" >&2; exit 1; }
# The version only if src is itself a git checkout (not a copy inside another repository).
if [ "$(git -C "$src" rev-parse --show-toplevel 2>/dev/null)" = "$src" ]; then
  git -C "$src" describe --tags --always --dirty
else
  echo "(source without git history)"
fi
