#!/usr/bin/env bash
# Builds a kind node image for Kubernetes $KUBERNETES_VERSION on the project's own Docker engine
# (docker.sh, which must be up), for machines where kind's own (kindest/node) cannot be pulled,
# the way `kind build node-image` assembles one, from what is built here:
#   - the base: kind-node.Dockerfile (Debian's systemd, containerd, runc, CNI plugins; kind's own
#     files from its Go module, $KIND_VERSION) with kubeadm, kubelet, kubectl and crictl, then
#     kind-node/ on top: a CNI configuration (ptp, one node) in place of kindnetd, the project's
#     volume provisioner in place of local-path (default-storage.yaml), IP forwarding in the node,
#     and no lowering of oom_score_adj (which these VMs' root may not do);
#   - preloaded into the node's containerd, under the names kubeadm asks for: kube-apiserver,
#     kube-controller-manager, kube-scheduler (the project's binaries, no OS), kube-proxy (on the
#     Debian image, for iptables), etcd (the project's $ETCD_VERSION), CoreDNS (tools/coredns),
#     pause (e2e/localcluster/pause, also as containerd's sandbox image) and the provisioner.
#
#   kind-node.sh      builds it unless the engine has it from the same inputs; prints its name
#
# Its inputs (these files, kind's, every binary) are hashed into the image's label
# io.kvcluster.inputs: a change to any of them builds it again.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
NODE_IMAGE=kvcluster.io/kind-node:$KUBERNETES_VERSION
INPUTS_LABEL=io.kvcluster.inputs

log() { echo "[kind-node $(date +%H:%M:%S)] $*" >&2; }
die() { echo "kind-node.sh: $*" >&2; exit 1; }
docker() { "$here/docker.sh" docker "$@"; }

"$here/docker.sh" status || die "the project's Docker engine is not up (e2e/localcluster/docker.sh up)"
"$here/build.sh" kubernetes kubeadm crictl coredns "etcd-$ETCD_VERSION"
kube=$("$here/build.sh" --print-dir kubernetes)
crictl=$("$here/build.sh" --print-dir crictl)/crictl
coredns=$("$here/build.sh" --print-dir coredns)/coredns
etcd=$("$here/build.sh" --print-dir "etcd-$ETCD_VERSION")
download=$(cd "$here/tools/kubernetes" && go mod download -json "sigs.k8s.io/kind@$KIND_VERSION") ||
  die "cannot download kind $KIND_VERSION's module: $(echo "$download" | jq -r .Error)"
kind_module=$(echo "$download" | jq -r .Dir)
[ -d "$kind_module/images/base/files" ] || die "kind $KIND_VERSION's module has no images/base/files"

work=$(mktemp -d)
cid=""
cleanup() {
  [ -z "$cid" ] || docker rm -f "$cid" >/dev/null 2>&1 || true
  rm -rf -- "$work"
}
trap cleanup EXIT

# The project's own programs in the node: the pause image's and the provisioner's.
# Without the clone's path or commit in them (-trimpath, -buildvcs=false): they are inputs of the
# image's key, which must change only when they do.
(cd "$here/../.." && CGO_ENABLED=0 go build -trimpath -buildvcs=false -o "$work/imgpack" ./e2e/localcluster/imgpack &&
  CGO_ENABLED=0 go build -trimpath -buildvcs=false -o "$work/pause" ./e2e/localcluster/pause &&
  CGO_ENABLED=0 go build -trimpath -buildvcs=false -o "$work/provisioner" ./e2e/localcluster/provisioner)

inputs=$( {
  cat "$0" "$here/kind-node.Dockerfile" "$here/versions.env" "$work/imgpack"
  (cd "$here/kind-node" && find . -printf '%p %m\n' | sort) # names and modes; contents below
  find "$here/kind-node" "$kind_module/images/base/files" -type f | sort | xargs cat
  cat "$kube/kubeadm" "$kube/kubelet" "$kube/kubectl" "$kube/kube-apiserver" "$kube/kube-controller-manager" \
    "$kube/kube-scheduler" "$kube/kube-proxy" "$crictl" "$coredns" "$etcd/etcd" "$work/pause" "$work/provisioner"
  docker image inspect -f '{{.Id}}' "$("$here/docker.sh" debian)"
} | sha256sum | cut -c1-16)
if [ "$(docker image inspect -f "{{index .Config.Labels \"$INPUTS_LABEL\"}}" "$NODE_IMAGE" 2>/dev/null)" = "$inputs" ]; then
  echo "$NODE_IMAGE"
  exit 0
fi
start=$SECONDS
debian=$("$here/docker.sh" debian)

# The base, as kind's images/base/Dockerfile sets file modes: scripts 0755, the rest 0644.
log "building the node's base from $debian"
mkdir -p "$work/base/bin"
cp -r "$kind_module/images/base/files" "$work/base/files"
cp -r "$here/kind-node/." "$work/base/files/"
echo "$KUBERNETES_VERSION" >"$work/base/files/kind/version" # kind reads the node's version there
chmod -R u+w,go-w "$work/base/files"
find "$work/base/files" -type d -exec chmod 0755 {} +
find "$work/base/files" -type f -exec chmod 0644 {} +
chmod 0755 "$work/base/files/usr/local/bin/"* "$work/base/files/kind/bin/"*
cp "$kube/kubeadm" "$kube/kubelet" "$kube/kubectl" "$crictl" "$work/base/bin/"
docker build -q --network host --force-rm --build-arg "BASE=$debian" -f "$here/kind-node.Dockerfile" \
  -t "$NODE_IMAGE-base" "$work/base" >/dev/null

# The images kubeadm asks for, by the names its manifests use (the kubelet can pull none of them
# here), and containerd's sandbox image.
mkdir -p "$work/images"
images=$("$kube/kubeadm" config images list --kubernetes-version "$KUBERNETES_VERSION")
sandbox=$(sed -n 's/^[[:space:]]*sandbox_image = "\(.*\)"$/\1/p' "$kind_module/images/base/files/etc/containerd/config.toml")
pack() { "$work/imgpack" -out "$work/images/$(echo "$1" | tr '/:' '__').tar" -tag "$@"; }
for image in $images "$sandbox"; do
  name=${image%:*} name=${name##*/}
  case $name in
    kube-apiserver | kube-controller-manager | kube-scheduler)
      pack "$image" -file "$kube/$name=/usr/local/bin/$name" ;;
    kube-proxy)
      # kube-proxy programs the node's iptables: it needs their commands.
      mkdir -p "$work/kube-proxy" && cp "$kube/kube-proxy" "$work/kube-proxy/"
      printf '%s\n' "FROM $debian" \
        "RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iptables nftables conntrack && rm -rf /var/lib/apt/lists/*" \
        "COPY kube-proxy /usr/local/bin/kube-proxy" >"$work/kube-proxy/Dockerfile"
      docker build -q --network host --force-rm -t "$image" "$work/kube-proxy" >/dev/null
      docker save -o "$work/images/kube-proxy.tar" "$image" ;;
    etcd)
      pack "$image" -file "$etcd/etcd=/usr/local/bin/etcd" -file "$etcd/etcdctl=/usr/local/bin/etcdctl" \
        -file "$etcd/etcdutl=/usr/local/bin/etcdutl" -entrypoint /usr/local/bin/etcd ;;
    coredns)
      pack "$image" -file "$coredns=/coredns" -entrypoint /coredns ;;
    pause)
      pack "$image" -file "$work/pause=/pause" -entrypoint /pause ;;
    *) die "kubeadm asks for $image, which is not built here" ;;
  esac
done
pack kvcluster.io/provisioner:dev -file "$work/provisioner=/provisioner" -entrypoint /provisioner

# Preloaded as kind does: the base's containerd, started alone, imports them (content only, as
# kind's --no-unpack), then the container is committed with the base's entrypoint.
log "preloading $(ls "$work/images" | wc -l) images"
cid=$(docker run -d --network none --security-opt seccomp=unconfined --entrypoint sleep "$NODE_IMAGE-base" infinity)
docker exec -d "$cid" containerd
for i in $(seq 51); do
  docker exec "$cid" ctr version >/dev/null 2>&1 && break
  [ "$i" -lt 51 ] || die "the node's containerd did not answer within 10s"
  sleep 0.2
done
for tar in "$work/images"/*.tar; do
  # (Debian's ctr cannot label them pinned as kind does; kind's kubelet collects no images anyway.)
  docker exec -i "$cid" ctr -n k8s.io images import --no-unpack --all-platforms - <"$tar" >/dev/null ||
    die "could not preload $(basename "$tar")"
done
docker exec "$cid" pkill containerd
for i in $(seq 51); do
  docker exec "$cid" pgrep containerd >/dev/null 2>&1 || break
  [ "$i" -lt 51 ] || die "the node's containerd did not stop within 10s"
  sleep 0.2
done
docker commit --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' --change 'CMD []' \
  --change "LABEL $INPUTS_LABEL=$inputs io.kvcluster.stand-in=\"kind node image made by e2e/localcluster/kind-node.sh\"" \
  "$cid" "$NODE_IMAGE" >/dev/null
docker rm -f "$cid" >/dev/null && cid=""
docker rmi "$NODE_IMAGE-base" >/dev/null
log "$NODE_IMAGE in $((SECONDS - start))s"
echo "$NODE_IMAGE"
