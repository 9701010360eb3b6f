#!/usr/bin/env bash
# The project's own Docker engine (Debian's docker.io), for machines where images cannot be
# pulled: it builds the project's Dockerfiles on local stand-ins for their base images (and runs
# kind for `make e2e`). Isolated: its own data, sockets and configuration; no default bridge, no
# iptables rules, no IP forwarding or masquerading, so nothing it runs reaches past this machine.
#
#   docker.sh up          start it (idempotent)
#   docker.sh down        stop it and every container, unmount and remove its run folder; the
#                         images stay in the cache for the next run (idempotent)
#   docker.sh docker ARG...  runs the docker client of the same package against it
#   docker.sh env         prints `export DOCKER_HOST=...` for a shell: eval "$(docker.sh env)"
#   docker.sh stand-ins   give the engine the base images the Dockerfiles start from, made here
#                         (see make_stand_ins), unless it has images of those names already
#   docker.sh check       run a privileged container (as kind's nodes are) and an unprivileged
#                         one on the Go image, each without a network: fails unless both run
#   docker.sh status      exit 0 when the engine answers
#
# Its images live in the cache ($KVC_CACHE, else ~/.cache/kvcluster-operator) under docker/.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${KVC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvcluster-operator}
DATA=$cache/docker
RUN=/run/kvcluster-docker
SOCK=$RUN/docker.sock
# The client of the same package as the engine: a newer `docker` elsewhere on PATH may need
# plugins (buildx) this engine's builder does not.
DOCKER_CLI=/usr/bin/docker
# The base images of the project's Dockerfiles (FROM lines) that make_stand_ins can make.
GO_IMAGE=golang:1.26
STATIC_IMAGE=gcr.io/distroless/static:nonroot
STAND_IN_LABEL=io.kvcluster.stand-in

log() { echo "[docker $(date +%H:%M:%S)] $*" >&2; }
die() { echo "docker.sh ${action:-}: $*" >&2; exit 1; }
action=${1:-}

docker() { DOCKER_HOST=unix://$SOCK "$DOCKER_CLI" "$@"; }
answers() { [ -S "$SOCK" ] && docker version >/dev/null 2>&1; }

check_prereqs() {
  [ "$(uname -s)" = Linux ] || die "needs Linux (this is $(uname -s))"
  [ "$(id -u)" = 0 ] || die "needs root: it runs dockerd"
  local missing=()
  command -v dockerd >/dev/null && [ -x "$DOCKER_CLI" ] || missing+=(docker.io)
  command -v jq >/dev/null || missing+=(jq) # docker-runc edits container specs with it
  command -v runc >/dev/null || missing+=(runc)
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing Debian packages: ${missing[*]}"
  command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them (Debian/Ubuntu expected)"
  mkdir -p "$DATA"
  # --no-install-recommends: docker.io's recommendations (apparmor, needrestart) may restart the
  # machine's services.
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
    >"$DATA/apt.log" 2>&1 || die "could not install ${missing[*]}; see $DATA/apt.log"
}

up() {
  check_prereqs
  answers && return 0
  down_quietly
  mkdir -p "$RUN" "$DATA/data"
  # An empty configuration: the machine's /etc/docker/daemon.json is for its own engine, if any.
  echo '{}' >"$RUN/daemon.json"
  log "starting dockerd (data in $DATA/data, log $DATA/dockerd.log)"
  setsid dockerd --config-file "$RUN/daemon.json" --data-root "$DATA/data" --exec-root "$RUN/exec" \
    --pidfile "$RUN/dockerd.pid" -H "unix://$SOCK" \
    --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false --bridge=none \
    --add-runtime "kvc-runc=$here/docker-runc" --default-runtime kvc-runc \
    >"$DATA/dockerd.log" 2>&1 </dev/null &
  local i
  for i in $(seq 60); do
    answers && { log "dockerd is up"; return 0; }
    kill -0 $! 2>/dev/null || break
    sleep 0.5
  done
  tail -20 "$DATA/dockerd.log" >&2 || true
  die "dockerd did not answer on $SOCK within 30s (log: $DATA/dockerd.log)"
}

down_quietly() {
  local pid="" i
  [ -f "$RUN/dockerd.pid" ] && pid=$(cat "$RUN/dockerd.pid")
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    # dockerd stops its containers (each within its stop timeout) before it exits.
    answers && docker ps -q | xargs -r "$DOCKER_CLI" -H "unix://$SOCK" stop -t 5 >/dev/null 2>&1 || true
    kill "$pid" 2>/dev/null || true
    for i in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  # What the engine's own containerd and its shims left (found by their exec root).
  pkill -9 -f -- "$RUN/exec" 2>/dev/null || true
  # The engine's mounts (network namespaces, container root file systems), deepest first.
  local m
  for m in $(awk -v run="$RUN" -v data="$DATA/data" 'index($2, run) == 1 || index($2, data) == 1 {print $2}' /proc/self/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  [ -d "$RUN" ] && rm -rf -- "${RUN:?}"
  return 0
}

down() {
  [ "$(id -u)" = 0 ] || die "needs root"
  down_quietly
  log "dockerd is down (images kept in $DATA/data)"
}

# debian_mirror prints the machine's Debian mirror, read from its apt sources (deb822 or
# one-line format); none is written into the repository.
debian_mirror() {
  local uri
  uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ {print $2}' | grep -v -- '-security' | head -1 || true)
  [ -n "$uri" ] || uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk '$1 == "deb" {print ($2 ~ /^\[/ ? $3 : $2)}' | grep -v -- '-security' | head -1 || true)
  [ -n "$uri" ] || die "no Debian mirror in /etc/apt/sources.list*"
  echo "$uri"
}

# make_stand_ins makes, for each base image the Dockerfiles start from that the engine lacks and
# cannot pull, a local stand-in under the same name, labelled $STAND_IN_LABEL so it is never
# taken for the real one (`docker image inspect`):
#   golang:1.26 — a Debian rootfs (debootstrap, minbase, with make and CA certificates) holding
#     this machine's Go toolchain (which must be 1.26), GOPATH=/go and GOTOOLCHAIN=local as in the
#     official image;
#   gcr.io/distroless/static:nonroot — no shell or package manager: CA certificates, time zones,
#     /etc/passwd with root, nobody and nonroot (65532), /tmp, running as 65532 in /home/nonroot.
# Both carry this machine's CA bundle (what `go mod download` needs to reach the module proxy
# through this machine's network).
make_stand_ins() {
  local used
  used=$(cat "$here/../../Dockerfile" "$here"/../*.Dockerfile | awk '$1 == "FROM" {print $2}' | sort -u)
  local image
  for image in $used; do
    case $image in "$GO_IMAGE" | "$STATIC_IMAGE") ;; *) die "a Dockerfile starts from $image, which has no stand-in here" ;; esac
  done
  local want=()
  for image in $used; do
    docker image inspect "$image" >/dev/null 2>&1 && continue
    # The real image when a registry answers; a stand-in only when it cannot be pulled.
    docker pull -q "$image" >/dev/null 2>&1 && { log "pulled $image"; continue; }
    want+=("$image")
  done
  [ ${#want[@]} -eq 0 ] && return 0
  command -v debootstrap >/dev/null || {
    log "installing Debian's debootstrap"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap; } \
      >"$DATA/apt.log" 2>&1 || die "could not install debootstrap; see $DATA/apt.log"
  }
  local work; work=$(mktemp -d "$DATA/.stand-ins.XXXXXX")
  # shellcheck disable=SC2064 # the folder is known now
  trap "rm -rf -- '$work'" EXIT
  local mirror suite=bookworm start=$SECONDS
  mirror=$(debian_mirror)
  log "debootstrap $suite from $mirror (minbase, make, ca-certificates, tzdata)"
  debootstrap --variant=minbase --include=make,ca-certificates,tzdata "$suite" "$work/rootfs" "$mirror" \
    >"$DATA/debootstrap.log" 2>&1 || die "debootstrap failed; see $DATA/debootstrap.log"
  cp /etc/ssl/certs/ca-certificates.crt "$work/rootfs/etc/ssl/certs/ca-certificates.crt"
  log "rootfs in $((SECONDS - start))s"
  for image in "${want[@]}"; do
    case $image in
      "$GO_IMAGE") go_stand_in "$work" ;;
      "$STATIC_IMAGE") static_stand_in "$work" ;;
    esac
  done
}

go_stand_in() {
  local work=$1 goroot version
  goroot=$(go env GOROOT) version=$(go env GOVERSION)
  case $version in "go${GO_IMAGE#golang:}" | "go${GO_IMAGE#golang:}".*) ;; *)
    die "$GO_IMAGE's stand-in holds this machine's Go, which is $version" ;;
  esac
  log "$GO_IMAGE: stand-in with $version"
  mkdir -p "$work/rootfs/usr/local/go" "$work/rootfs/go/bin"
  cp -a "$goroot/." "$work/rootfs/usr/local/go/"
  tar -C "$work/rootfs" -c . | docker import \
    --change "ENV PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --change "ENV GOLANG_VERSION=${version#go}" --change "ENV GOPATH=/go" --change "ENV GOTOOLCHAIN=local" \
    --change "WORKDIR /go" --change "LABEL $STAND_IN_LABEL=\"debootstrap $suite with $version, made by e2e/localcluster/docker.sh\"" \
    - "$GO_IMAGE" >/dev/null
  rm -rf -- "$work/rootfs/usr/local/go" "$work/rootfs/go"
}

static_stand_in() {
  local work=$1 root=$1/static
  log "$STATIC_IMAGE: stand-in"
  mkdir -p "$root/etc/ssl/certs" "$root/usr/share" "$root/tmp" "$root/home/nonroot"
  cp "$work/rootfs/etc/ssl/certs/ca-certificates.crt" "$root/etc/ssl/certs/"
  cp -a "$work/rootfs/usr/share/zoneinfo" "$root/usr/share/"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' >"$root/etc/group"
  chmod 1777 "$root/tmp"
  chown 65532:65532 "$root/home/nonroot"
  tar -C "$root" -c . | docker import --change "USER 65532" --change "WORKDIR /home/nonroot" \
    --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt" \
    --change "LABEL $STAND_IN_LABEL=\"CA certificates and time zones from debootstrap $suite, made by e2e/localcluster/docker.sh\"" \
    - "$STATIC_IMAGE" >/dev/null
}

# check runs what kind's node containers need of the engine (privileged, every capability this
# machine allows) and an ordinary container, each printing its effective capabilities.
check() {
  local privileged plain
  privileged=$(docker run --rm --network none --privileged --entrypoint sh "$GO_IMAGE" -c 'grep CapEff /proc/self/status') ||
    die "a privileged container does not run (see $DATA/dockerd.log)"
  plain=$(docker run --rm --network none --entrypoint sh "$GO_IMAGE" -c 'grep CapEff /proc/self/status') ||
    die "a container does not run (see $DATA/dockerd.log)"
  log "privileged container: $privileged; unprivileged: $plain"
  [ "$privileged" != "$plain" ] || die "a privileged container got no more capabilities than another"
}

case $action in
  up) up ;;
  down) down ;;
  docker) shift; exec env DOCKER_HOST="unix://$SOCK" "$DOCKER_CLI" "$@" ;;
  env) echo "export DOCKER_HOST=unix://$SOCK" ;;
  stand-ins) answers || die "dockerd is not up (docker.sh up)"; make_stand_ins ;;
  check) answers || die "dockerd is not up (docker.sh up)"; check ;;
  status) answers ;;
  *) echo "usage: $0 up|down|docker ARG...|env|stand-ins|check|status" >&2; exit 2 ;;
esac
