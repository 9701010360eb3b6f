#!/usr/bin/env bash
# Packs the images the tests run into tarballs, without Docker: etcd (server, etcdctl, etcdutl in
# /usr/local/bin, tagged like the official gcr.io/etcd-development/etcd images, so manifests are
# the same here and on kind) and the operator (the binary `make build` makes, as the Dockerfile does).
#
#   images.sh OUTDIR OPERATOR_IMAGE OPERATOR_BINARY
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
out=$1 operator_image=$2 operator_bin=$3
mkdir -p "$out"
imgpack="$out/.imgpack"
(cd "$here/../.." && CGO_ENABLED=0 go build -o "$imgpack" ./e2e/localcluster/imgpack)
for v in "$ETCD_PREVIOUS_VERSION" "$ETCD_VERSION"; do
  bin=$("$here/build.sh" --print-dir "etcd-$v")
  "$here/build.sh" "etcd-$v"
  tar="$out/etcd-v$v.tar"
  # Rebuild only when a binary is newer than the tarball.
  if [ ! -f "$tar" ] || [ -n "$(find "$bin" -newer "$tar" -type f)" ]; then
    "$imgpack" -tag "gcr.io/etcd-development/etcd:v$v" -out "$tar" \
      -file "$bin/etcd=/usr/local/bin/etcd" -file "$bin/etcdctl=/usr/local/bin/etcdctl" \
      -file "$bin/etcdutl=/usr/local/bin/etcdutl" -entrypoint /usr/local/bin/etcd
  fi
done
"$imgpack" -tag "$operator_image" -out "$out/operator.tar" \
  -file "$operator_bin=/kvcluster-operator" -entrypoint /kvcluster-operator -user 65532:65532
# versitygw is the S3-compatible store of the backup tests.
"$here/build.sh" versitygw
gw=$("$here/build.sh" --print-dir versitygw)/versitygw
if [ ! -f "$out/versitygw.tar" ] || [ "$gw" -nt "$out/versitygw.tar" ]; then
  "$imgpack" -tag kvcluster.io/versitygw:dev -out "$out/versitygw.tar" -file "$gw=/usr/local/bin/versitygw" \
    -entrypoint /usr/local/bin/versitygw -user 65532:65532
fi
# Prometheus runs the shipped alert rules against a real cluster in e2e.
"$here/build.sh" prometheus
prom=$("$here/build.sh" --print-dir prometheus)/prometheus
if [ ! -f "$out/prometheus.tar" ] || [ "$prom" -nt "$out/prometheus.tar" ]; then
  "$imgpack" -tag kvcluster.io/prometheus:dev -out "$out/prometheus.tar" -file "$prom=/bin/prometheus" \
    -entrypoint /bin/prometheus -user 65532:65532
fi
# netcheck proves from inside a pod that the local cluster is isolated (local cluster only).
(cd "$here/../.." && CGO_ENABLED=0 go build -o "$out/.netcheck" ./e2e/localcluster/netcheck)
"$imgpack" -tag kvcluster.io/netcheck:dev -out "$out/netcheck.tar" -file "$out/.netcheck=/netcheck" -entrypoint /netcheck -user 65532:65532
# writer is the e2e suite's client that writes continuously during upgrades, scaling and healing.
(cd "$here/../.." && CGO_ENABLED=0 go build -o "$out/.writer" ./e2e/writer)
"$imgpack" -tag kvcluster.io/writer:dev -out "$out/writer.tar" -file "$out/.writer=/writer" -entrypoint /writer -user 65532:65532
ls "$out"/*.tar
