#!/usr/bin/env bash
# A real single-node Kubernetes cluster from source-built binaries, for machines without Docker:
# control plane as local processes, containerd + kubelet running real pods, kube-proxy, CoreDNS,
# a dynamic volume provisioner, and kube-router enforcing NetworkPolicies (firewall only).
#
#   cluster.sh up        start it (idempotent); kubeconfig at $KVC_CLUSTER_DIR/kubeconfig
#   cluster.sh down      stop it and remove every process, mount, cgroup, iptables rule, bridge
#                        and route it made (idempotent)
#   cluster.sh import F  import an image tarball into the node's containerd
#   cluster.sh status    exit 0 when the cluster answers
#   cluster.sh signal SIG CONTAINER_ID   send SIG (KILL, STOP, CONT...) to every process of one
#                        container, from the host: a crash or a freeze no container can fake
#   cluster.sh restart PROCESS  stop a control-plane process (kube-apiserver...) and start it again
#   cluster.sh supervise  (started by up) start the controller manager or scheduler again when it exits
#
# Isolation: nothing addressed to the cluster may leave through the machine's own interface.
# Blackhole routes for the cluster ranges and iptables drop rules are installed before anything
# starts; pods reach only the pod bridge and the node address; CoreDNS has no upstream.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
DIR=${KVC_CLUSTER_DIR:-/var/lib/kvcluster-local}
RUN=/run/kvcluster-local
NODE=kvc-node
NODE_IP=10.245.0.1          # on the bridge kvcnode0, made here
NODE_NET=10.245.0.0/16
POD_CIDR=10.244.0.0/24      # the CNI bridge kvcbr0
POD_NET=10.244.0.0/16
SERVICE_CIDR=10.96.0.0/16
API_SERVICE_IP=10.96.0.1
NODE_BRIDGE=kvcnode0
POD_BRIDGE=kvcbr0
CHAIN=KVC-ISOLATION
# Routing table for what arrives from the pod bridge: only the cluster's ranges go on from it.
POD_ROUTES=245
CLUSTER_NETS=("$SERVICE_CIDR" "$POD_NET" "$NODE_NET")
STORAGE_CLASS=kvc-local
CONTAINERD_SOCK=$RUN/containerd.sock

log() { echo "[cluster $(date +%H:%M:%S)] $*" >&2; }
die() { echo "cluster.sh ${action:-}: $*" >&2; reported=1; exit 1; }

# No silent failure: a failing command reports itself (ERR, in the main shell only, so a failure
# in a subshell is told once), and any other non-zero exit is reported on EXIT.
action=${1:-} reported= tmp=
set -E
on_err() {
  [ "$BASHPID" = "$$" ] || return 0
  echo "cluster.sh $action: '$3' failed (exit $1) at line $2 in ${4:-main}" >&2
  reported=1
}
on_exit() {
  local rc=$?
  [ -z "$tmp" ] || rm -rf -- "${tmp:?}"
  [ "$rc" = 0 ] || [ -n "$reported" ] || echo "cluster.sh $action: failed (exit $rc)" >&2
}
trap 'on_err $? $LINENO "$BASH_COMMAND" "${FUNCNAME[0]:-}"' ERR
trap on_exit EXIT

# `down` deletes $DIR and $RUN recursively: refuse anything but a dedicated absolute folder.
case $DIR in
  /*/*) ;;
  *) die "KVC_CLUSTER_DIR must be an absolute path below /, such as /var/lib/kvcluster-local (got '$DIR')" ;;
esac

kube_bin() { echo "$("$here/build.sh" --print-dir kubernetes)/$1"; }
kubectl() { "$(kube_bin kubectl)" --kubeconfig "$DIR/kubeconfig" "$@"; }

# --- prerequisites -------------------------------------------------------------------------------

check_prereqs() {
  [ "$(uname -s)" = Linux ] || die "needs Linux (this is $(uname -s))"
  [ "$(id -u)" = 0 ] || die "needs root: it runs containerd and the kubelet, and sets up bridges and iptables"
  local missing=()
  for c in containerd runc ctr iptables ipset ip openssl conntrack socat curl; do command -v "$c" >/dev/null || missing+=("$c"); done
  [ -x /usr/lib/cni/bridge ] || missing+=(cni-plugins)
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing Debian packages for: ${missing[*]}"
    command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them (Debian/Ubuntu expected)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        containerd runc containernetworking-plugins iptables ipset conntrack socat ethtool iproute2 openssl curl kmod; } >"$DIR.apt.log" 2>&1 ||
      die "could not install packages (containerd runc containernetworking-plugins iptables ipset conntrack socat iproute2 openssl curl); see $DIR.apt.log"
  fi
  [ -d "$CGROUP_ROOT" ] || die "no $CGROUP_ROOT"
  if [ "$(cgroup_version)" = 2 ]; then
    # cgroup v2 without systemd: the kubelet (cgroupfs driver) needs the controllers enabled for
    # the root's children, which is systemd's job elsewhere.
    local c
    for c in $(cat "$CGROUP_ROOT/cgroup.controllers"); do
      grep -qw "$c" "$CGROUP_ROOT/cgroup.subtree_control" ||
        echo "+$c" >"$CGROUP_ROOT/cgroup.subtree_control" 2>/dev/null ||
        log "warning: cannot enable the $c controller in $CGROUP_ROOT/cgroup.subtree_control"
    done
  fi
}

# --- cgroups -------------------------------------------------------------------------------------

CGROUP_ROOT=${KVC_CGROUP_ROOT:-/sys/fs/cgroup} # another root only to test these functions

# cgroup_version: 2 on a unified (cgroup v2) machine, 1 on a v1 or hybrid one.
cgroup_version() { if [ "$(stat -fc %T "$CGROUP_ROOT")" = cgroup2fs ]; then echo 2; else echo 1; fi; }

# kubepods_cgroups prints the kubelet's pod cgroup trees (cgroupfs driver): $CGROUP_ROOT/kubepods
# on cgroup v2; $CGROUP_ROOT/<controller>/kubepods on v1, including unified/kubepods on a hybrid
# machine. Both layouts are looked for, whatever the machine says it is.
kubepods_cgroups() {
  local d
  for d in "$CGROUP_ROOT"/kubepods "$CGROUP_ROOT"/*/kubepods; do [ -d "$d" ] && echo "$d"; done
  return 0
}

# pod_processes prints the PIDs of every process in the pod cgroups.
pod_processes() {
  local hier
  for hier in $(kubepods_cgroups); do find "$hier" -name cgroup.procs -exec cat {} + 2>/dev/null || true; done
}

# signal_container SIG ID sends SIG to every process in the cgroup of the container ID (the
# kubelet's cgroupfs driver names it by the ID, under its pod's cgroup).
signal_container() {
  local sig=$1 id=$2 hier pids=""
  [[ $id =~ ^[0-9a-f]{64}$ ]] || die "not a container ID: $id"
  for hier in $(kubepods_cgroups); do
    pids+=" $(find "$hier" -maxdepth 3 -type d -name "$id" -exec cat {}/cgroup.procs \; 2>/dev/null || true)"
  done
  pids=$(echo "$pids" | tr ' ' '\n' | sed '/^$/d' | sort -u | tr '\n' ' ')
  # One by one: a process that exits meanwhile must not keep the signal from the others.
  local pid reached=0
  for pid in $pids; do kill -s "$sig" "$pid" 2>/dev/null && reached=$((reached + 1)); done
  [ "$reached" -gt 0 ] || die "no process of container $id took SIG$sig"
}

# remove_pod_cgroups kills what still runs in the pod cgroups, waits until they are empty (a
# killed process leaves its cgroup a moment later), then removes them, deepest first.
remove_pod_cgroups() {
  pod_processes | xargs -r kill -9 2>/dev/null || true
  local i
  for i in $(seq 50); do [ -z "$(pod_processes)" ] && break; sleep 0.2; done
  [ -z "$(pod_processes)" ] || log "warning: processes still in the pod cgroups after 10s: $(pod_processes | tr '\n' ' ')"
  local hier
  for hier in $(kubepods_cgroups); do find "$hier" -depth -type d -exec rmdir {} \; 2>/dev/null || true; done
  [ -z "$(kubepods_cgroups)" ] || log "warning: pod cgroups left: $(kubepods_cgroups | tr '\n' ' ')"
}

# --- network isolation (first thing up, last thing down) -----------------------------------------

network_up() {
  ip link show "$NODE_BRIDGE" >/dev/null 2>&1 || ip link add "$NODE_BRIDGE" type bridge
  ip addr replace "$NODE_IP/32" dev "$NODE_BRIDGE"
  ip link set "$NODE_BRIDGE" up
  for net in "${CLUSTER_NETS[@]}"; do ip route replace blackhole "$net"; done
  modprobe br_netfilter 2>/dev/null || true
  [ -f "$DIR/ip_forward.saved" ] || cat /proc/sys/net/ipv4/ip_forward >"$DIR/ip_forward.saved"
  sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 2>/dev/null || sysctl -qw net.ipv4.ip_forward=1

  # Routing: a packet from a pod to anything but the cluster's ranges has no route (the host
  # answers "network unreachable" at once), whatever the firewall tables say. A NetworkPolicy
  # engine rewrites the filter table and accepts what its policies allow, ahead of any rule of
  # ours there (kube-router does), so the isolation must not depend on the filter table.
  while ip rule del iif "$POD_BRIDGE" lookup "$POD_ROUTES" 2>/dev/null; do :; done
  ip rule add iif "$POD_BRIDGE" lookup "$POD_ROUTES" priority 1000
  for net in "${CLUSTER_NETS[@]}"; do ip route replace throw "$net" table "$POD_ROUTES"; done
  ip route replace unreachable default table "$POD_ROUTES"
  # Forwarding, checked again in the mangle table (before any filter rule, and left alone by the
  # policy engine): only between pods on the pod bridge; pods reach the node address locally.
  iptables -t mangle -N "$CHAIN" 2>/dev/null || iptables -t mangle -F "$CHAIN"
  iptables -t mangle -A "$CHAIN" -i "$POD_BRIDGE" -o "$POD_BRIDGE" -j RETURN
  iptables -t mangle -A "$CHAIN" -i "$POD_BRIDGE" -j DROP
  iptables -t mangle -A "$CHAIN" -o "$POD_BRIDGE" -j DROP
  iptables -t mangle -A "$CHAIN" -i "$NODE_BRIDGE" -j DROP
  iptables -t mangle -A "$CHAIN" -o "$NODE_BRIDGE" -j DROP
  iptables -t mangle -C FORWARD -j "$CHAIN" 2>/dev/null || iptables -t mangle -I FORWARD 1 -j "$CHAIN"
  # Output: the cluster ranges only through loopback and our bridges, never another interface
  # (in the filter table: it sees where a Service address was translated to).
  iptables -N "$CHAIN-OUT" 2>/dev/null || iptables -F "$CHAIN-OUT"
  for dev in lo "$POD_BRIDGE" "$NODE_BRIDGE"; do iptables -A "$CHAIN-OUT" -o "$dev" -j RETURN; done
  for net in "${CLUSTER_NETS[@]}"; do iptables -A "$CHAIN-OUT" -d "$net" -j DROP; done
  iptables -C OUTPUT -j "$CHAIN-OUT" 2>/dev/null || iptables -I OUTPUT 1 -j "$CHAIN-OUT"
}

# remove_kube_chains deletes every KUBE-* chain, and every rule jumping to one, that the kubelet
# and kube-proxy made (kube-proxy --cleanup leaves the kubelet's own, e.g. KUBE-FIREWALL).
remove_kube_chains() {
  local ipt table rule
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    for table in filter nat mangle raw; do
      "$ipt-save" -t "$table" 2>/dev/null | grep -E '^-A [^ ]+ .*-j KUBE-' | grep -vE '^-A KUBE-' |
        while read -r rule; do eval "$ipt -t $table ${rule/-A/-D}" 2>/dev/null || true; done || true
      for chain in $("$ipt-save" -t "$table" 2>/dev/null | sed -nE 's/^:(KUBE-[^ ]+) .*/\1/p'); do
        "$ipt" -t "$table" -F "$chain" 2>/dev/null || true
      done
      for chain in $("$ipt-save" -t "$table" 2>/dev/null | sed -nE 's/^:(KUBE-[^ ]+) .*/\1/p'); do
        "$ipt" -t "$table" -X "$chain" 2>/dev/null || true
      done
    done
  done
}

network_down() {
  remove_kube_chains
  # kube-router's address sets, once no rule refers to them (its own --cleanup-config needs IPVS).
  if command -v ipset >/dev/null; then
    local set
    for set in $(ipset list -n 2>/dev/null | sed -n '/^KUBE-/p'); do ipset destroy "$set" 2>/dev/null || true; done
  fi
  local table
  # (both tables: earlier versions of this script had the forwarding rules in the filter table)
  for table in mangle filter; do
    while iptables -t $table -D FORWARD -j "$CHAIN" 2>/dev/null; do :; done
    while iptables -t $table -D OUTPUT -j "$CHAIN-OUT" 2>/dev/null; do :; done
    for c in "$CHAIN" "$CHAIN-OUT"; do iptables -t $table -F "$c" 2>/dev/null || true; iptables -t $table -X "$c" 2>/dev/null || true; done
  done
  while ip rule del iif "$POD_BRIDGE" lookup "$POD_ROUTES" 2>/dev/null; do :; done
  ip route flush table "$POD_ROUTES" 2>/dev/null || true
  for net in "${CLUSTER_NETS[@]}"; do ip route del blackhole "$net" 2>/dev/null || true; done
  for dev in "$POD_BRIDGE" "$NODE_BRIDGE"; do ip link del "$dev" 2>/dev/null || true; done
  if [ -f "$DIR/ip_forward.saved" ]; then sysctl -qw "net.ipv4.ip_forward=$(cat "$DIR/ip_forward.saved")"; fi
}

# --- PKI -----------------------------------------------------------------------------------------

cert() { # name CN O [SANs]
  local name=$1 cn=$2 o=$3 sans=${4:-} ca=${5:-ca}
  [ -f "$DIR/pki/$name.crt" ] && return 0
  local subj="/CN=$cn"; [ -n "$o" ] && subj="/O=$o$subj"
  openssl genrsa -out "$DIR/pki/$name.key" 2048 2>/dev/null
  openssl req -new -key "$DIR/pki/$name.key" -subj "$subj" -out "$DIR/pki/$name.csr" 2>/dev/null
  local ext="$DIR/pki/$name.ext"
  { echo "basicConstraints=CA:FALSE"; echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=serverAuth,clientAuth"; [ -n "$sans" ] && echo "subjectAltName=$sans"; } >"$ext"
  openssl x509 -req -in "$DIR/pki/$name.csr" -CA "$DIR/pki/$ca.crt" -CAkey "$DIR/pki/$ca.key" -CAcreateserial \
    -days 30 -extfile "$ext" -out "$DIR/pki/$name.crt" 2>/dev/null
}

pki() {
  mkdir -p "$DIR/pki"
  for ca in ca front-proxy-ca; do
    [ -f "$DIR/pki/$ca.crt" ] && continue
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$DIR/pki/$ca.key" -out "$DIR/pki/$ca.crt" \
      -days 30 -subj "/CN=kvc-local-$ca" 2>/dev/null
  done
  cert apiserver kube-apiserver "" "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:$API_SERVICE_IP,IP:$NODE_IP"
  cert admin kubernetes-admin system:masters
  cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
  cert controller-manager system:kube-controller-manager ""
  cert scheduler system:kube-scheduler ""
  cert kube-proxy system:kube-proxy ""
  cert kubelet "system:node:$NODE" system:nodes "DNS:$NODE,IP:$NODE_IP"
  cert front-proxy-client front-proxy-client "" "" front-proxy-ca
  [ -f "$DIR/pki/sa.key" ] || { openssl genrsa -out "$DIR/pki/sa.key" 2048 2>/dev/null; openssl rsa -in "$DIR/pki/sa.key" -pubout -out "$DIR/pki/sa.pub" 2>/dev/null; }
  for who in admin controller-manager scheduler kube-proxy kubelet; do
    local kc="$DIR/$who.kubeconfig"; [ "$who" = admin ] && kc="$DIR/kubeconfig"
    cat >"$kc" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kvc-local
  cluster: {certificate-authority: $DIR/pki/ca.crt, server: "https://$NODE_IP:6443"}
users:
- name: $who
  user: {client-certificate: $DIR/pki/$who.crt, client-key: $DIR/pki/$who.key}
contexts:
- name: kvc-local
  context: {cluster: kvc-local, user: $who}
current-context: kvc-local
EOF
  done
}

# --- processes -----------------------------------------------------------------------------------

# start NAME BINARY ARGS...: runs a process in the background, remembering its PID and binary.
start() {
  local name=$1 bin=$2; shift 2
  if alive "$name"; then return 0; fi
  mkdir -p "$DIR/logs" "$DIR/pids"
  # 9>&-: not the control-plane lock's descriptor, which would hold the lock for the process's life.
  nohup "$bin" "$@" >"$DIR/logs/$name.log" 2>&1 </dev/null 9>&- &
  echo "$! $(readlink -f "$bin")" >"$DIR/pids/$name"
}

# alive NAME: the recorded PID still runs the recorded binary (PIDs are reused quickly).
alive() {
  local f="$DIR/pids/$1" pid bin
  [ -f "$f" ] || return 1
  read -r pid bin <"$f"
  [ "$(readlink -f "/proc/$pid/exe" 2>/dev/null)" = "$bin" ]
}

stop() {
  local name=$1 f="$DIR/pids/$1" pid bin
  [ -f "$f" ] || return 0
  read -r pid bin <"$f"
  if alive "$name"; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do alive "$name" || break; sleep 0.2; done
    alive "$name" && kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

wait_for() { # description seconds command...
  local what=$1 secs=$2; shift 2
  for _ in $(seq $((secs * 2))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
  die "$what did not come up within ${secs}s; logs in $DIR/logs/"
}

# wait_proc NAME SECONDS COMMAND...: waits until COMMAND succeeds, failing at once, with the end
# of its log, when the process NAME exits meanwhile.
wait_proc() {
  local name=$1 secs=$2; shift 2
  for _ in $(seq $((secs * 2))); do
    "$@" >/dev/null 2>&1 && return 0
    alive "$name" || die "$name exited; the end of $DIR/logs/$name.log:
$(tail -n 5 "$DIR/logs/$name.log" 2>/dev/null)"
    sleep 0.5
  done
  die "$name not ready within ${secs}s (waited for: $*); the end of $DIR/logs/$name.log:
$(tail -n 5 "$DIR/logs/$name.log" 2>/dev/null)"
}

healthz() { curl -sfk -o /dev/null "$1"; } # -f: any HTTP error status fails

api_ready() { curl -sf --cacert "$DIR/pki/ca.crt" --cert "$DIR/pki/admin.crt" --key "$DIR/pki/admin.key" "https://$NODE_IP:6443/readyz"; }

control_plane_up() {
  local etcd; etcd="$("$here/build.sh" --print-dir "etcd-$ETCD_VERSION")/etcd"
  start etcd "$etcd" --name=kvc-local --data-dir="$DIR/etcd" --unsafe-no-fsync \
    --listen-client-urls=http://127.0.0.1:23790 --advertise-client-urls=http://127.0.0.1:23790 \
    --listen-peer-urls=http://127.0.0.1:23800 --initial-advertise-peer-urls=http://127.0.0.1:23800 \
    --initial-cluster=kvc-local=http://127.0.0.1:23800 --listen-metrics-urls=http://127.0.0.1:23810
  wait_proc etcd 30 curl -sf http://127.0.0.1:23790/health

  start kube-apiserver "$(kube_bin kube-apiserver)" \
    --etcd-servers=http://127.0.0.1:23790 --bind-address="$NODE_IP" --advertise-address="$NODE_IP" --secure-port=6443 \
    --service-cluster-ip-range="$SERVICE_CIDR" --authorization-mode=Node,RBAC --allow-privileged=true \
    --client-ca-file="$DIR/pki/ca.crt" --tls-cert-file="$DIR/pki/apiserver.crt" --tls-private-key-file="$DIR/pki/apiserver.key" \
    --kubelet-client-certificate="$DIR/pki/apiserver-kubelet-client.crt" --kubelet-client-key="$DIR/pki/apiserver-kubelet-client.key" \
    --service-account-key-file="$DIR/pki/sa.pub" --service-account-signing-key-file="$DIR/pki/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --requestheader-client-ca-file="$DIR/pki/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$DIR/pki/front-proxy-client.crt" --proxy-client-key-file="$DIR/pki/front-proxy-client.key" \
    --enable-admission-plugins=NodeRestriction --profiling=false \
    --kubelet-preferred-address-types=InternalIP
  wait_proc kube-apiserver 90 api_ready

  start_kube-controller-manager
  start_kube-scheduler
  wait_proc kube-controller-manager 60 healthz https://127.0.0.1:10257/healthz
  wait_proc kube-scheduler 60 healthz https://127.0.0.1:10259/healthz
}

start_kube-controller-manager() {
  start kube-controller-manager "$(kube_bin kube-controller-manager)" \
    --kubeconfig="$DIR/controller-manager.kubeconfig" --authentication-kubeconfig="$DIR/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$DIR/controller-manager.kubeconfig" --bind-address=127.0.0.1 \
    --leader-elect=false --use-service-account-credentials=true --controllers='*' \
    --root-ca-file="$DIR/pki/ca.crt" --service-account-private-key-file="$DIR/pki/sa.key" \
    --cluster-signing-cert-file="$DIR/pki/ca.crt" --cluster-signing-key-file="$DIR/pki/ca.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" --allocate-node-cidrs=false
}

start_kube-scheduler() {
  start kube-scheduler "$(kube_bin kube-scheduler)" --kubeconfig="$DIR/scheduler.kubeconfig" \
    --authentication-kubeconfig="$DIR/scheduler.kubeconfig" --authorization-kubeconfig="$DIR/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false
}

# The controller manager and the scheduler exit by design on some conditions, and are restarted by
# whatever runs them (a kubelet, systemd): the scheduler exits when its cache finds a pod updated
# on another node than it assumed, as after an API server restart interrupted a binding (seen in
# CI at 17:58 on 2026-12-03: no pod was scheduled any more). `supervise` plays that part for them,
# every 2 s; it restarts only what was started and not stopped (a stopped process has no pid
# file). Starting and stopping control-plane processes hold $DIR/control-plane.lock, so it never
# races `restart` or `up`.
SUPERVISED=(kube-controller-manager kube-scheduler)

# The lock is held at most for a restart of the API server (90 s) and the processes after it.
with_control_plane_lock() { (flock -w 300 9 && "$@") 9>"$DIR/control-plane.lock"; }

supervise() {
  local p
  while alive supervisor; do
    sleep 2
    for p in "${SUPERVISED[@]}"; do
      [ -f "$DIR/pids/$p" ] && ! alive "$p" || continue
      with_control_plane_lock restart_exited "$p" || log "$p: could not start it again; trying on"
    done
  done
}

restart_exited() {
  local p=$1
  [ -f "$DIR/pids/$p" ] && ! alive "$p" || return 0
  log "$p exited; starting it again. The end of its log ($DIR/logs/$p.previous.log):"
  tail -n 3 "$DIR/logs/$p.log" | sed 's/^/    /' >&2
  mv -f "$DIR/logs/$p.log" "$DIR/logs/$p.previous.log"
  "start_$p"
}

containerd_up() {
  mkdir -p "$DIR/containerd" "$RUN" "$DIR/cni" "$DIR/opt"
  cat >"$DIR/cni/10-kvc.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "kvc", "plugins": [
  {"type": "bridge", "bridge": "$POD_BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": "$DIR/cni-ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}
]}
EOF
  cat >"$DIR/containerd.toml" <<EOF
version = 2
root = "$DIR/containerd"
state = "$RUN/containerd"
[grpc]
  address = "$CONTAINERD_SOCK"
[ttrpc]
  address = "$RUN/containerd.sock.ttrpc"
[debug]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$DIR/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$DIR/cni"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
EOF
  start containerd "$(command -v containerd)" --config "$DIR/containerd.toml"
  wait_proc containerd 30 ctr -a "$CONTAINERD_SOCK" version
  if ! ctr -a "$CONTAINERD_SOCK" -n k8s.io images check "name==$PAUSE_IMAGE" 2>/dev/null | grep -q "$PAUSE_IMAGE"; then
    tmp=$(mktemp -d) # global: on_exit removes it if the build fails
    (cd "$here/../.." && CGO_ENABLED=0 go build -o "$tmp/pause" ./e2e/localcluster/pause &&
      go run ./e2e/localcluster/imgpack -tag "$PAUSE_IMAGE" -out "$tmp/pause.tar" -file "$tmp/pause=/pause" -entrypoint /pause)
    import_image "$tmp/pause.tar"
    rm -rf -- "${tmp:?}"; tmp=
  fi
}

import_image() { ctr -a "$CONTAINERD_SOCK" -n k8s.io images import --no-unpack=false "$1" >/dev/null; }

kubelet_up() {
  mkdir -p "$DIR/kubelet"
  : >"$DIR/resolv.conf" # pods never get the host's resolver
  cat >"$DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $DIR/pki/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $DIR/pki/kubelet.crt
tlsPrivateKeyFile: $DIR/pki/kubelet.key
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
clusterDNS: [$NODE_IP]
clusterDomain: cluster.local
resolvConf: $DIR/resolv.conf
evictionHard: {memory.available: "200Mi", nodefs.available: "2%", imagefs.available: "2%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
EOF
  # A restarted kubelet must report the node again: its Ready condition from before does not count.
  local since=; alive kubelet || since=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  start kubelet "$(kube_bin kubelet)" --config="$DIR/kubelet.yaml" --kubeconfig="$DIR/kubelet.kubeconfig" \
    --root-dir="$DIR/kubelet" --hostname-override="$NODE" --node-ip="$NODE_IP" --cert-dir="$DIR/kubelet/pki"
  wait_proc kubelet 120 node_ready "$since"
}

provisioner_ready() { [ "$(grep -c '"Starting workers"' "$DIR/logs/provisioner.log")" -ge 2 ]; }

# node_ready [SINCE]: the node is Ready, as reported by the kubelet at or after SINCE (RFC 3339, UTC).
node_ready() {
  local r; r=$(kubectl get node "$NODE" -o jsonpath='{range .status.conditions[?(@.type=="Ready")]}{.status} {.lastHeartbeatTime}{end}')
  [ "${r%% *}" = True ] && [[ ! "${r#* }" < "${1:-}" ]]
}

addons_up() {
  cat >"$DIR/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: $DIR/kube-proxy.kubeconfig}
hostnameOverride: $NODE
bindAddress: $NODE_IP
clusterCIDR: $POD_NET
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["$NODE_IP/32"]
conntrack: {maxPerCore: 0}
EOF
  start kube-proxy "$(kube_bin kube-proxy)" --config="$DIR/kube-proxy.yaml"
  wait_proc kube-proxy 60 healthz http://127.0.0.1:10256/healthz

  # CoreDNS is built with exactly the plugins this Corefile uses: a directive added here needs its
  # plugin imported in tools/coredns/main.go, or CoreDNS refuses to start.
  cat >"$DIR/Corefile" <<EOF
.:53 {
    bind $NODE_IP
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $DIR/kubeconfig
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 10
    ready 127.0.0.1:18181
}
EOF
  start coredns "$("$here/build.sh" --print-dir coredns)/coredns" -conf "$DIR/Corefile"

  mkdir -p "$DIR/volumes"
  local prov="$DIR/bin/provisioner"
  mkdir -p "$DIR/bin"
  [ -x "$prov" ] || (cd "$here/../.." && CGO_ENABLED=0 go build -o "$prov" ./e2e/localcluster/provisioner)
  start provisioner "$prov" --kubeconfig="$DIR/kubeconfig" --root="$DIR/volumes" --node="$NODE" --storage-class="$STORAGE_CLASS"
  # CoreDNS is ready once its kubernetes plugin has synced with the API server; the provisioner
  # once both its controllers have synced their caches and started their workers.
  wait_proc coredns 60 curl -sf http://127.0.0.1:18181/ready
  wait_proc provisioner 60 provisioner_ready
  kubectl apply -f - >/dev/null <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: $STORAGE_CLASS
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kvcluster.io/local-volume
reclaimPolicy: Delete
volumeBindingMode: Immediate
allowVolumeExpansion: true
EOF
  wait_for "the default service account" 60 kubectl get serviceaccount default -n default

  # NetworkPolicies are enforced by kube-router's firewall alone (the bridge plugin routes); it
  # watches pods, namespaces and policies with the admin's credentials (a test cluster) and lets
  # the node itself through, so the kubelet's probes and port-forwards keep working.
  start kube-router "$("$here/build.sh" --print-dir kube-router)/kube-router" --kubeconfig="$DIR/kubeconfig" \
    --run-firewall=true --run-router=false --run-service-proxy=false --enable-cni=false \
    --hostname-override="$NODE" --health-port=20244 --metrics-port=0
  wait_proc kube-router 60 healthz http://127.0.0.1:20244/healthz
}

# The cluster's host processes, in start order.
PROCS=(etcd kube-apiserver kube-controller-manager kube-scheduler supervisor containerd kubelet kube-proxy coredns provisioner kube-router)

dead_procs() { local p; for p in "${PROCS[@]}"; do alive "$p" || echo "$p"; done; }

# up starts what is not running and waits until it all works. Every step is idempotent: a process
# still running is kept, a dead one is started again (with the same data, certificates and pods),
# missing binaries, images and files are made. So `up` also repairs a cluster one of whose
# processes died, without losing its workloads.
up() {
  check_prereqs
  local dead p
  if [ -f "$DIR/kubeconfig" ]; then
    dead=$(dead_procs | tr '\n' ' ')
    if [ -z "$dead" ] && api_ready >/dev/null 2>&1 && node_ready 2>/dev/null; then
      log "already up; kubeconfig: $DIR/kubeconfig"
      return 0
    fi
    if [ -n "$dead" ]; then
      log "not running: ${dead% }; starting them again (the rest of the cluster is kept)"
      for p in $dead; do
        [ -s "$DIR/logs/$p.log" ] || continue
        log "last lines of $DIR/logs/$p.log:"; tail -n 3 "$DIR/logs/$p.log" | sed 's/^/    /' >&2
      done
    else
      log "every process runs, but the API server or the node is not ready: checking each part"
    fi
  fi
  local t=$SECONDS
  "$here/build.sh" envtest kubernetes coredns kube-router
  mkdir -p "$DIR"
  network_up
  pki
  with_control_plane_lock control_plane_up
  start supervisor "$(readlink -f "$BASH")" "$here/cluster.sh" supervise
  containerd_up
  kubelet_up
  addons_up
  dead=$(dead_procs | tr '\n' ' ')
  [ -z "$dead" ] || die "exited while the cluster came up: ${dead% }; logs in $DIR/logs/"
  log "up in $((SECONDS - t))s; kubeconfig: $DIR/kubeconfig"
}

down() {
  [ "$(id -u)" = 0 ] || die "needs root"
  [ -d "$DIR" ] || [ -d "$RUN" ] || { network_down; return 0; }
  # Under the lock: a supervisor stopped half-way through starting a process would leave it untracked.
  if [ -d "$DIR" ]; then with_control_plane_lock stop supervisor || stop supervisor; fi
  for p in kube-router provisioner coredns kube-proxy kubelet; do stop $p; done
  # Kill every container process: the pod cgroups list them, the shims are ours by their socket.
  pod_processes | xargs -r kill -9 2>/dev/null || true
  pgrep -f "containerd-shim.*-address $CONTAINERD_SOCK" | xargs -r kill -9 2>/dev/null || true
  stop containerd
  for p in kube-scheduler kube-controller-manager kube-apiserver etcd; do stop $p; done
  [ -x "$(kube_bin kube-proxy)" ] && "$(kube_bin kube-proxy)" --cleanup >/dev/null 2>&1 || true
  # Unmount what the kubelet and containerd mounted (deepest first).
  awk -v d="$DIR" -v r="$RUN" '$2 ~ "^"d"/" || $2 ~ "^"r"/" || $2 == r {print $2}' /proc/mounts | sort -r |
    while read -r m; do umount -l "$m" 2>/dev/null || true; done
  remove_pod_cgroups
  network_down
  rm -rf -- "${RUN:?}"
  rm -rf -- "${DIR:?}" "${DIR:?}.apt.log"
  log "down"
}

restart_process() {
  alive "$1" || die "$1 is not running"
  stop "$1"
  mv -f "$DIR/logs/$1.log" "$DIR/logs/$1.previous.log" # start truncates the log; keep the stopped one's
  control_plane_up
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) api_ready >/dev/null && node_ready ;;
  import) shift; for f in "$@"; do import_image "$f"; done ;;
  signal) [ $# -eq 3 ] || die "usage: $0 signal SIG CONTAINER_ID"; signal_container "$2" "$3" ;;
  restart)
    [ $# -eq 2 ] || die "usage: $0 restart PROCESS"
    case $2 in etcd | kube-apiserver | kube-controller-manager | kube-scheduler) ;; *) die "restart: only control-plane processes" ;; esac
    with_control_plane_lock restart_process "$2" ;;
  supervise) supervise ;;
  # Internal: the pod cgroup handling alone, for testing it on a fake or a cgroup v2 root.
  cgroups) echo "cgroup v$(cgroup_version) at $CGROUP_ROOT"; kubepods_cgroups ;;
  remove-pod-cgroups) remove_pod_cgroups ;;
  *) echo "usage: $0 up|down|status|import TARBALL...|signal SIG CONTAINER_ID|restart PROCESS" >&2; exit 2 ;;
esac
