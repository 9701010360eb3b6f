#!/usr/bin/env bash
# The project's own Docker engine (Debian's docker.io), for machines where images cannot be
# pulled: it builds the project's Dockerfiles on local stand-ins for their base images, and runs
# kind for `make e2e` (KVC_LOCAL_DOCKER=1). Isolated: its own data, sockets and configuration;
# dockerd makes no default bridge and no iptables rules, forwarding or masquerading; kind's nodes
# join a network made here (network_up) whose bridge forwards nothing past itself: nothing they
# run reaches past this machine.
#
#   docker.sh up          start it (idempotent)
#   docker.sh down        stop it and every container, unmount and remove its run folder; the
#                         images stay in the cache for the next run (idempotent; refused while a
#                         `with` holds the engine)
#   docker.sh docker ARG...  runs the docker client of the same package against it
#   docker.sh with CMD ARG...  runs CMD with the engine up and its own: waits until no other
#                         `with` holds it (/run/kvcluster-docker.lock), starts it, runs CMD with what
#                         `env` sets, and stops it however CMD ends (a `with` inside CMD just runs)
#   docker.sh env         prints what a shell needs to use it: eval "$(docker.sh env)" sets
#                         DOCKER_HOST and puts its client first on PATH as `docker` (for kind)
#   docker.sh stand-ins   give the engine the base images the Dockerfiles start from, made here
#                         (see make_stand_ins), unless it has images of those names already
#   docker.sh debian      give the engine a Debian rootfs image (debian_image); prints its name
#   docker.sh check       run a privileged container (as kind's nodes are), a privileged exec (as
#                         kind's commands are) and an unprivileged one: fails unless all run
#   docker.sh status      exit 0 when the engine answers
#
# Its images live in the cache ($KVC_CACHE, else ~/.cache/kvcluster-operator) under docker/.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${KVC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvcluster-operator}
DATA=$cache/docker
RUN=/run/kvcluster-docker
SOCK=$RUN/docker.sock
# Held (flock) by `docker.sh with` while its command runs: beside the engine's run folder (which
# `down` removes), machine-wide as the engine is, whatever cache a run uses.
LOCK=/run/kvcluster-docker.lock
# The client of the same package as the engine: a newer `docker` elsewhere on PATH may need
# plugins (buildx) this engine's builder does not.
DOCKER_CLI=/usr/bin/docker
# The base images of the project's Dockerfiles (FROM lines) that make_stand_ins can make.
GO_IMAGE=golang:1.26
STATIC_IMAGE=gcr.io/distroless/static:nonroot
STAND_IN_LABEL=io.kvcluster.stand-in
# The network kind's nodes join (KIND_EXPERIMENTAL_DOCKER_NETWORK, which kind reuses as it is):
# made here on a bridge of a known name and range, so the firewall can keep it to this machine.
KIND_NETWORK=kvc-kind
KIND_BRIDGE=kvckind0
KIND_SUBNET=10.246.0.0/24
CHAIN=KVC-DOCKER-ISOLATION
# The Debian rootfs the stand-ins and the kind node image start from (made here).
DEBIAN_SUITE=bookworm
DEBIAN_IMAGE=kvcluster.io/debian:$DEBIAN_SUITE

log() { echo "[docker $(date +%H:%M:%S)] $*" >&2; }
die() { echo "docker.sh ${action:-}: $*" >&2; exit 1; }
action=${1:-}

docker() { DOCKER_HOST=unix://$SOCK "$DOCKER_CLI" "$@"; }
answers() { [ -S "$SOCK" ] && docker version >/dev/null 2>&1; }

# apt_install installs Debian packages (--no-install-recommends: docker.io's recommendations,
# apparmor and needrestart, may restart the machine's services) under a policy-rc.d that refuses
# to start services, unless the machine has its own: the package's engine (docker.service) would
# add its bridge, forwarding and masquerading to the machine.
apt_install() {
  log "installing Debian packages: $*"
  command -v apt-get >/dev/null || die "missing $* and no apt-get to install them (Debian/Ubuntu expected)"
  mkdir -p "$DATA"
  local policy="" status=0
  [ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; policy=1; }
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"; } \
    >"$DATA/apt.log" 2>&1 || status=$?
  [ -z "$policy" ] || rm -f /usr/sbin/policy-rc.d
  [ "$status" = 0 ] || die "could not install $*; see $DATA/apt.log"
}

check_prereqs() {
  [ "$(uname -s)" = Linux ] || die "needs Linux (this is $(uname -s))"
  [ "$(id -u)" = 0 ] || die "needs root: it runs dockerd"
  local missing=()
  command -v dockerd >/dev/null && [ -x "$DOCKER_CLI" ] || missing+=(docker.io)
  command -v jq >/dev/null || missing+=(jq) # docker-runc edits container specs with it
  command -v runc >/dev/null || missing+=(runc)
  command -v iptables >/dev/null || missing+=(iptables) # kind's network is kept to this machine
  command -v flock >/dev/null || missing+=(util-linux) # `with` holds the engine with it
  [ ${#missing[@]} -eq 0 ] && return 0
  apt_install "${missing[@]}"
  if [ -d /run/systemd/system ] && [[ " ${missing[*]} " == *" docker.io "* ]]; then
    systemctl disable --now docker.service docker.socket >>"$DATA/apt.log" 2>&1 || true
  fi
}

up() {
  check_prereqs
  # The firewall first, and on every call: kind's nodes restart with the engine.
  firewall_up
  answers && { network_check; return 0; }
  down_quietly
  firewall_up
  mkdir -p "$RUN/bin" "$DATA/data"
  # `docker` for programs that run it from PATH (kind): the client matching this engine.
  ln -sf "$DOCKER_CLI" "$RUN/bin/docker"
  # An empty configuration: the machine's /etc/docker/daemon.json is for its own engine, if any.
  echo '{}' >"$RUN/daemon.json"
  log "starting dockerd (data in $DATA/data, log $DATA/dockerd.log)"
  setsid dockerd --config-file "$RUN/daemon.json" --data-root "$DATA/data" --exec-root "$RUN/exec" \
    --pidfile "$RUN/dockerd.pid" -H "unix://$SOCK" \
    --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false --bridge=none \
    --add-runtime "kvc-runc=$here/docker-runc" --default-runtime kvc-runc \
    >"$DATA/dockerd.log" 2>&1 </dev/null 9>&- &
  local i
  for i in $(seq 60); do
    answers && { network_up; network_check; log "dockerd is up"; return 0; }
    kill -0 $! 2>/dev/null || break
    sleep 0.5
  done
  tail -20 "$DATA/dockerd.log" >&2 || true
  die "dockerd did not answer on $SOCK within 30s (log: $DATA/dockerd.log)"
}

# network_up makes the network kind's nodes join (kind makes it otherwise, on a bridge the
# firewall would not know: network_check refuses that).
network_up() {
  docker network inspect "$KIND_NETWORK" >/dev/null 2>&1 ||
    docker network create -d bridge --subnet "$KIND_SUBNET" -o "com.docker.network.bridge.name=$KIND_BRIDGE" \
      -o com.docker.network.bridge.enable_ip_masquerade=false "$KIND_NETWORK" >/dev/null
}

network_check() {
  local bridge
  bridge=$(docker network inspect -f '{{index .Options "com.docker.network.bridge.name"}}' "$KIND_NETWORK" 2>/dev/null) ||
    die "the engine has no network $KIND_NETWORK"
  [ "$bridge" = "$KIND_BRIDGE" ] || die "network $KIND_NETWORK is on bridge '$bridge', not $KIND_BRIDGE: remove it (docker.sh docker network rm $KIND_NETWORK)"
}

# firewall_up keeps what enters kind's bridge from the nodes to it: forwarded only between its
# own ports, never on (the machine answers the nodes itself, and reaches them through it and
# docker-proxy's published ports).
firewall_up() {
  iptables -t mangle -N "$CHAIN" 2>/dev/null || iptables -t mangle -F "$CHAIN"
  iptables -t mangle -A "$CHAIN" -i "$KIND_BRIDGE" -o "$KIND_BRIDGE" -j RETURN
  iptables -t mangle -A "$CHAIN" -i "$KIND_BRIDGE" -j DROP
  iptables -t mangle -A "$CHAIN" -o "$KIND_BRIDGE" -j DROP
  iptables -t mangle -C FORWARD -j "$CHAIN" 2>/dev/null || iptables -t mangle -I FORWARD 1 -j "$CHAIN"
}

# firewall_down, once the bridge is gone (nothing can pass it then).
firewall_down() {
  while iptables -t mangle -D FORWARD -j "$CHAIN" 2>/dev/null; do :; done
  iptables -t mangle -F "$CHAIN" 2>/dev/null || true
  iptables -t mangle -X "$CHAIN" 2>/dev/null || true
}

down_quietly() {
  local pid="" i
  [ -f "$RUN/dockerd.pid" ] && pid=$(cat "$RUN/dockerd.pid")
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    # Every container goes with the engine: a kind cluster a run left (interrupted before it
    # deleted it) would be found by name and reused, stopped, by the next.
    answers && docker ps -aq | xargs -r "$DOCKER_CLI" -H "unix://$SOCK" rm -f -v >/dev/null 2>&1 || true
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
  # dockerd leaves the bridges of its networks; it makes them again when it starts.
  ip link del "$KIND_BRIDGE" 2>/dev/null || true
  ip link show "$KIND_BRIDGE" >/dev/null 2>&1 || firewall_down
  return 0
}

down() {
  [ "$(id -u)" = 0 ] || die "needs root"
  if [ -z "${KVC_DOCKER_HELD:-}" ] && [ -e "$LOCK" ]; then
    exec 9>"$LOCK"
    flock -n 9 || die "a run holds the engine (docker.sh with, lock $LOCK): it stops the engine when it ends"
  fi
  down_quietly
  log "dockerd is down (images kept in $DATA/data)"
}

engine_env() {
  echo "export DOCKER_HOST=unix://$SOCK PATH=$RUN/bin:\$PATH KIND_EXPERIMENTAL_DOCKER_NETWORK=$KIND_NETWORK"
}

# with: two runs on one engine (make image-dockerfile-local and make e2e, say) would each stop it
# under the other; the second waits instead. The lock is the open file's (flock), so it goes with
# the process that held it, however that ended.
with() {
  [ $# -gt 0 ] || die "usage: docker.sh with COMMAND [ARG...]"
  [ -z "${KVC_DOCKER_HELD:-}" ] || exec "$@"
  # Under `make -n`, `-q` or `-t` (make runs a line naming $(MAKE) even then, and the Makefile's
  # `with` lines do) the command is a make that runs no recipe: it runs alone, nothing starts.
  local makeflags=${MAKEFLAGS:-}
  case ${makeflags%% *} in -*) ;; *[nqt]*) exec "$@" ;; esac
  [ "$(id -u)" = 0 ] || die "needs root: it runs dockerd"
  command -v flock >/dev/null || check_prereqs
  mkdir -p "$DATA"
  exec 9>"$LOCK"
  if ! flock -n 9; then
    log "waiting for the run that holds the engine to end (lock $LOCK)"
    flock 9
  fi
  trap 'down_quietly; log "dockerd is down (images kept in $DATA/data)"' EXIT
  # An engine up now was left by a run killed outright (its lock went with it) or started by hand:
  # it goes, with its containers (a kind cluster e2e-framework would find by name and reuse).
  down_quietly
  up
  # The command runs in a session of its own, in the background, so that a TERM or INT sent to
  # this script (make sends TERM to its own child only) reaches all of it at once (go test, the
  # test binary, kind) and the engine stops after it, not when it ends by itself. It does not hold
  # the lock (9>&-): what it leaves running must not hold the next run off.
  (eval "$(engine_env)" && export KVC_DOCKER_HELD=1 && exec setsid "$@" 9>&- <&0) &
  child=$!
  trap 'stop_child; exit 130' INT
  trap 'stop_child; exit 143' TERM
  local status=0
  wait "$child" || status=$?
  exit "$status"
}

stop_child() {
  kill -TERM -- "-$child" "$child" 2>/dev/null || true
  wait "$child" 2>/dev/null || true
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

# debian_image gives the engine $DEBIAN_IMAGE unless it has it: a Debian rootfs made with
# debootstrap (minbase, with make, CA certificates and time zones) from the machine's mirror,
# holding the machine's CA bundle (what reaching the Go module proxy through this machine's
# network needs). The stand-ins and the kind node image start from it.
debian_image() {
  docker image inspect "$DEBIAN_IMAGE" >/dev/null 2>&1 && return 0
  command -v debootstrap >/dev/null || apt_install debootstrap
  local work mirror start=$SECONDS
  work=$(mktemp -d "$DATA/.debian.XXXXXX")
  mirror=$(debian_mirror)
  log "$DEBIAN_IMAGE: debootstrap $DEBIAN_SUITE from $mirror (minbase, make, ca-certificates, tzdata)"
  debootstrap --variant=minbase --include=make,ca-certificates,tzdata "$DEBIAN_SUITE" "$work/rootfs" "$mirror" \
    >"$DATA/debootstrap.log" 2>&1 || { rm -rf -- "$work"; die "debootstrap failed; see $DATA/debootstrap.log"; }
  cp /etc/ssl/certs/ca-certificates.crt "$work/rootfs/etc/ssl/certs/ca-certificates.crt"
  tar -C "$work/rootfs" -c . | docker import \
    --change "LABEL $STAND_IN_LABEL=\"debootstrap $DEBIAN_SUITE --variant=minbase, made by e2e/localcluster/docker.sh\"" \
    - "$DEBIAN_IMAGE" >/dev/null
  rm -rf -- "$work"
  log "$DEBIAN_IMAGE in $((SECONDS - start))s"
}

# make_stand_ins makes, for each base image the Dockerfiles start from that the engine lacks and
# cannot pull, a local stand-in under the same name, labelled $STAND_IN_LABEL so it is never
# taken for the real one (`docker image inspect`), from $DEBIAN_IMAGE:
#   golang:1.26 — this machine's Go toolchain (which must be 1.26) in /usr/local/go, GOPATH=/go
#     and GOTOOLCHAIN=local as in the official image;
#   gcr.io/distroless/static:nonroot — no shell or package manager: CA certificates, time zones,
#     /etc/passwd with root, nobody and nonroot (65532), /tmp, running as 65532 in /home/nonroot.
make_stand_ins() {
  local used image
  used=$(cat "$here/../../Dockerfile" "$here"/../*.Dockerfile | awk '$1 == "FROM" {print $2}' | sort -u)
  for image in $used; do
    case $image in "$GO_IMAGE" | "$STATIC_IMAGE") ;; *) die "a Dockerfile starts from $image, which has no stand-in here" ;; esac
  done
  local label
  for image in $used; do
    if label=$(docker image inspect -f "{{index .Config.Labels \"$STAND_IN_LABEL\"}}" "$image" 2>/dev/null); then
      # A Go stand-in holding another Go than this machine's is made again (GOTOOLCHAIN=local
      # cannot build a go.mod that asks for a newer patch release).
      [ "$image" = "$GO_IMAGE" ] && [ -n "$label" ] && [[ $label != *" $(go env GOVERSION),"* ]] || continue
      log "$GO_IMAGE: the stand-in is not of $(go env GOVERSION) ($label)"
      docker rmi "$GO_IMAGE" >/dev/null
    fi
    # The real image when a registry answers; a stand-in only when it cannot be pulled.
    docker pull -q "$image" >/dev/null 2>&1 && { log "pulled $image"; continue; }
    debian_image
    case $image in
      "$GO_IMAGE") go_stand_in ;;
      "$STATIC_IMAGE") static_stand_in ;;
    esac
  done
}

go_stand_in() {
  local version work
  version=$(go env GOVERSION)
  case $version in "go${GO_IMAGE#golang:}" | "go${GO_IMAGE#golang:}".*) ;; *)
    die "$GO_IMAGE's stand-in holds this machine's Go, which is $version" ;;
  esac
  log "$GO_IMAGE: stand-in with $version"
  work=$(mktemp -d "$DATA/.go.XXXXXX")
  cp -a "$(go env GOROOT)" "$work/go"
  printf '%s\n' "FROM $DEBIAN_IMAGE" "COPY go /usr/local/go" \
    "ENV PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    "ENV GOLANG_VERSION=${version#go} GOPATH=/go GOTOOLCHAIN=local" "RUN mkdir -p /go/bin" "WORKDIR /go" \
    "LABEL $STAND_IN_LABEL=\"$DEBIAN_IMAGE with $version, made by e2e/localcluster/docker.sh\"" >"$work/Dockerfile"
  docker build -q --network none --force-rm -t "$GO_IMAGE" "$work" >/dev/null || { rm -rf -- "$work"; die "$GO_IMAGE's stand-in did not build"; }
  rm -rf -- "$work"
}

static_stand_in() {
  local work root cid
  log "$STATIC_IMAGE: stand-in"
  work=$(mktemp -d "$DATA/.static.XXXXXX") root=$work/root
  mkdir -p "$root/etc/ssl/certs" "$root/usr/share" "$root/tmp" "$root/home/nonroot"
  cid=$(docker create "$DEBIAN_IMAGE" true)
  docker cp "$cid:/etc/ssl/certs/ca-certificates.crt" "$root/etc/ssl/certs/"
  docker cp "$cid:/usr/share/zoneinfo" "$root/usr/share/"
  docker rm "$cid" >/dev/null
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' >"$root/etc/group"
  chmod 1777 "$root/tmp"
  chown 65532:65532 "$root/home/nonroot"
  tar -C "$root" -c . | docker import --change "USER 65532" --change "WORKDIR /home/nonroot" \
    --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt" \
    --change "LABEL $STAND_IN_LABEL=\"CA certificates and time zones of $DEBIAN_IMAGE, made by e2e/localcluster/docker.sh\"" \
    - "$STATIC_IMAGE" >/dev/null
  rm -rf -- "$work"
}

# check runs what kind's node containers need of the engine (privileged, every capability this
# machine allows; a privileged exec in a running container) and an ordinary container.
check() {
  local privileged plain cid
  privileged=$(docker run --rm --network none --privileged --entrypoint sh "$GO_IMAGE" -c 'grep CapEff /proc/self/status') ||
    die "a privileged container does not run (see $DATA/dockerd.log)"
  # kind runs its commands in a node with `docker exec --privileged`.
  cid=$(docker run -d --rm --network none --entrypoint sleep "$GO_IMAGE" 60)
  docker exec --privileged "$cid" true || { docker rm -f "$cid" >/dev/null; die "docker exec --privileged does not run (see $DATA/dockerd.log)"; }
  docker rm -f "$cid" >/dev/null
  plain=$(docker run --rm --network none --entrypoint sh "$GO_IMAGE" -c 'grep CapEff /proc/self/status') ||
    die "a container does not run (see $DATA/dockerd.log)"
  log "privileged container: $privileged; unprivileged: $plain"
  [ "$privileged" != "$plain" ] || die "a privileged container got no more capabilities than another"
}

case $action in
  up) up ;;
  down) down ;;
  docker) shift; exec env DOCKER_HOST="unix://$SOCK" "$DOCKER_CLI" "$@" ;;
  with) shift; with "$@" ;;
  env) engine_env ;;
  stand-ins) answers || die "dockerd is not up (docker.sh up)"; make_stand_ins ;;
  debian) answers || die "dockerd is not up (docker.sh up)"; debian_image; echo "$DEBIAN_IMAGE" ;;
  check) answers || die "dockerd is not up (docker.sh up)"; check ;;
  status) answers ;;
  *) echo "usage: $0 up|down|with CMD ARG...|docker ARG...|env|stand-ins|debian|check|status" >&2; exit 2 ;;
esac
