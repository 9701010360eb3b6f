#!/usr/bin/env bash
# Builds the pinned binaries the tests run on, from source through the Go module proxy, into a
# cache outside the repository keyed by component and version, so every clone reuses them.
#
#   build.sh [component ...]     components: kubernetes kube-apiserver kubectl ... etcd-3.6.16
#                                etcd-3.7.3 coredns versitygw prometheus kwok kube-router helm
#                                gitops-crds envtest all; for the kind node image only (not in
#                                all): kubeadm crictl
#                                (default: all)
#   build.sh --print-dir NAME    prints the cache bin dir of NAME (kubernetes, etcd-3.7.3, ...)
#
# Versions come from versions.env. A binary is installed by an atomic rename only after it built,
# so an interrupted build is simply redone next time; its temporary folder is removed on any exit.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
ETCD_VERSIONS=("$ETCD_PREVIOUS_VERSION" "$ETCD_VERSION") # the last one is the newest
KUBE_COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
cache=${KVC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvcluster-operator}
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

bindir() {
  case $1 in
    # before kube-*: not a Kubernetes component
    kube-router) echo "$cache/kube-router-$KUBE_ROUTER_VERSION/bin" ;;
    kubernetes | kube-*) echo "$cache/kubernetes-$KUBERNETES_VERSION/bin" ;;
    kubectl | kubelet | kubeadm) echo "$cache/kubernetes-$KUBERNETES_VERSION/bin" ;;
    crictl) echo "$cache/crictl-$CRICTL_VERSION/bin" ;;
    etcd-*) echo "$cache/etcd-v${1#etcd-}/bin" ;;
    # tools/coredns picks the plugins: its files are part of the key, a full build is not it
    coredns) echo "$cache/coredns-$COREDNS_VERSION-$(cat "$here/tools/coredns/main.go" "$here/tools/coredns/go.sum" | sha256sum | cut -c1-12)/bin" ;;
    versitygw) echo "$cache/versitygw-$VERSITYGW_VERSION/bin" ;;
    prometheus) echo "$cache/prometheus-$PROMETHEUS_VERSION/bin" ;;
    kwok) echo "$cache/kwok-$KWOK_VERSION/bin" ;;
    helm) echo "$cache/helm-$HELM_VERSION/bin" ;;
    gitops-crds) echo "$cache/gitops-crds-argocd-$ARGOCD_VERSION-flux-$FLUX_SOURCE_CONTROLLER_VERSION-$FLUX_KUSTOMIZE_CONTROLLER_VERSION/crds" ;;
    envtest) echo "$cache/envtest-$KUBERNETES_VERSION-etcd-v${ETCD_VERSIONS[-1]}/bin" ;;
    *) echo "unknown component $1" >&2; return 1 ;;
  esac
}

log() { echo "[build $(date +%H:%M:%S)] $*" >&2; }
die() { echo "build.sh: $*" >&2; exit 1; }

# Temporary build folders of this run: removed on every exit, so a failed or interrupted build
# leaves nothing behind in the cache (a successful one has already moved its binaries out).
tmps=()
cleanup() {
  local t
  for t in "${tmps[@]}"; do
    case $t in */.tmp.*) rm -rf -- "${t:?}" ;; esac # only what mktemp_in made
  done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# mktemp_in DIR: a new temporary folder inside DIR (same file system, so the final mv is atomic),
# registered for cleanup; the caller reads its name from $tmp.
mktemp_in() {
  tmp=$(mktemp -d "${1:?}/.tmp.XXXXXX")
  tmps+=("$tmp")
}

# The tools modules pin the same versions as versions.env; building from a module that disagrees
# would put binaries of one version in the cache folder of another.
require_pin() { # go.mod module version
  grep -qE "^[[:space:]]*(require[[:space:]]+)?$2 $3\$" "$here/tools/$1/go.mod" ||
    die "e2e/localcluster/tools/$1/go.mod does not require $2 $3 as versions.env says"
}

# build_kube builds the given Kubernetes commands (those not cached yet) in one go invocation so
# they share compilation of their common packages.
build_kube() {
  local out todo=() c
  out=$(bindir kubernetes)
  for c in "$@"; do [ -x "$out/$c" ] || todo+=("$c"); done
  [ ${#todo[@]} -eq 0 ] && return 0
  mkdir -p "$out"
  local minor=${KUBERNETES_VERSION#v1.}; minor=${minor%%.*}
  local ldflags="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $p.gitVersion=$KUBERNETES_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
  done
  local tmp; mktemp_in "$out"
  local pkgs=(); for c in "${todo[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  log "building ${todo[*]} $KUBERNETES_VERSION (cold: many minutes)"
  local start=$SECONDS
  (cd "$here/tools/kubernetes" && go build -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}")
  for c in "${todo[@]}"; do mv -f "$tmp/$c" "$out/$c"; done
  rmdir "$tmp"
  log "built ${todo[*]} in $((SECONDS - start))s"
}

build_etcd() {
  local v=$1 out; out=$(bindir "etcd-$v")
  if [ -x "$out/etcd" ] && [ -x "$out/etcdctl" ] && [ -x "$out/etcdutl" ]; then return 0; fi
  mkdir -p "$out"
  local tmp; mktemp_in "$out"
  log "building etcd v$v"
  local start=$SECONDS
  (cd "$here/tools/etcd-v$v" &&
    go build -ldflags "-s -w" -o "$tmp/etcd" . &&
    go build -ldflags "-s -w" -o "$tmp/etcdctl" go.etcd.io/etcd/etcdctl/v3 &&
    go build -ldflags "-s -w" -o "$tmp/etcdutl" go.etcd.io/etcd/etcdutl/v3)
  mv -f "$tmp"/* "$out/"; rmdir "$tmp"
  log "built etcd v$v in $((SECONDS - start))s"
}

# build_coredns builds CoreDNS from tools/coredns: the plugins the local cluster's Corefile uses.
build_coredns() {
  local out; out=$(bindir coredns)
  [ -x "$out/coredns" ] && return 0
  mkdir -p "$out"
  local tmp; mktemp_in "$out"
  log "building coredns $COREDNS_VERSION (the local cluster's plugins)"
  local start=$SECONDS
  (cd "$here/tools/coredns" && go build -ldflags "-s -w" -o "$tmp/coredns" .)
  mv -f "$tmp/coredns" "$out/"; rmdir "$tmp"
  log "built coredns in $((SECONDS - start))s"
}

# build_install builds commands of a module that has no replace directives with go install (several
# commands of one module version in one invocation, so they share compilation).
build_install() {
  local name=$1 out pkg; shift; out=$(bindir "$name")
  local missing=0
  for pkg in "$@"; do [ -x "$out/$(basename "${pkg%@*}")" ] || missing=1; done
  [ $missing -eq 0 ] && return 0
  mkdir -p "$out"
  local tmp; mktemp_in "$out"
  log "building $*"
  local start=$SECONDS
  GOBIN=$tmp go install -ldflags "-s -w" "$@"
  mv -f "$tmp"/* "$out/"; rmdir "$tmp"
  log "built $* in $((SECONDS - start))s"
}

# build_gitops_crds copies the CRDs of the GitOps tools out of their Go modules (no build).
build_gitops_crds() {
  local out; out=$(bindir gitops-crds)
  [ -d "$out" ] && return 0
  mkdir -p "$(dirname "$out")"
  local tmp; mktemp_in "$(dirname "$out")"
  log "copying the CRDs of Argo CD $ARGOCD_VERSION and Flux from their modules"
  (cd "$here/tools/modfiles" && go run . -out "$tmp" \
    "github.com/argoproj/argo-cd/v3@$ARGOCD_VERSION" manifests/crds/application-crd.yaml -- \
    "github.com/fluxcd/source-controller@$FLUX_SOURCE_CONTROLLER_VERSION" config/crd/bases/source.toolkit.fluxcd.io_gitrepositories.yaml -- \
    "github.com/fluxcd/kustomize-controller@$FLUX_KUSTOMIZE_CONTROLLER_VERSION" config/crd/bases/kustomize.toolkit.fluxcd.io_kustomizations.yaml)
  mv "$tmp" "$out"
}

build() {
  case $1 in
    all)
      build envtest
      build_kube "${KUBE_COMMANDS[@]}"
      build coredns
      build versitygw
      build prometheus
      build kwok
      build kube-router
      build helm
      build gitops-crds ;;
    envtest)
      # KUBEBUILDER_ASSETS: one folder holding kube-apiserver and etcd (the newest one we build).
      build_kube kube-apiserver
      for v in "${ETCD_VERSIONS[@]}"; do build_etcd "$v"; done
      local assets; assets=$(bindir envtest)
      mkdir -p "$assets"
      ln -sfn "$(bindir kube-apiserver)/kube-apiserver" "$assets/kube-apiserver"
      ln -sfn "$(bindir "etcd-${ETCD_VERSIONS[-1]}")/etcd" "$assets/etcd" ;;
    kubernetes) build_kube "${KUBE_COMMANDS[@]}" ;;
    kube-router) build_install kube-router "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION" ;;
    # kubeadm sets up the kind node image's control plane (kind-node.sh); nothing else uses it
    kube-* | kubectl | kubelet | kubeadm) build_kube "$1" ;;
    # crictl: the kind node image's CRI client (kind runs it to load images)
    crictl) build_install crictl "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION" ;;
    etcd-*) build_etcd "${1#etcd-}" ;;
    coredns) build_coredns ;;
    versitygw) build_install versitygw "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION" ;;
    # promtool (the alert rules' unit tests) and the server (the e2e's alerts on a real cluster)
    prometheus) build_install prometheus "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION" \
      "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION" ;;
    # kwok simulates the fleet benchmark's node; kwokctl starts its control plane from our binaries
    kwok) build_install kwok "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" "sigs.k8s.io/kwok/cmd/kwokctl@$KWOK_VERSION" ;;
    # the chart's lint and template in make test, its install in e2e
    helm) build_install helm "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" ;;
    gitops-crds) build_gitops_crds ;;
    *) echo "build.sh: unknown component '$1'" >&2; exit 2 ;;
  esac
}

if [ "${1:-}" = --print-dir ]; then bindir "$2"; exit; fi
command -v go >/dev/null || die "Go is required (go1.26+ on PATH)"
require_pin kubernetes k8s.io/kubernetes "$KUBERNETES_VERSION"
require_pin coredns github.com/coredns/coredns "$COREDNS_VERSION"
for v in "${ETCD_VERSIONS[@]}"; do require_pin "etcd-v$v" go.etcd.io/etcd/server/v3 "v$v"; done
[ $# -eq 0 ] && set -- all
for c in "$@"; do build "$c"; done
