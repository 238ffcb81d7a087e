# shellcheck shell=bash
# Helpers for the network-boot lab (see tests/lab/README.md). Source it:
#   . tests/lab/lib.sh
# Every function is idempotent and safe to call from an EXIT trap (it never
# fails because something is already there or already gone).

# Debian packages the lab uses (build-artifacts installs the missing ones).
LAB_PACKAGES=(
    busybox-static cpio gzip xz-utils zstd # the initramfs
    qemu-system-x86 seabios ipxe-qemu ovmf # the machines (TCG)
    ipxe                                   # ipxe.efi / undionly.kpxe for TFTP
    iproute2                               # namespaces, bridge, taps, veths
    dnsmasq-base                           # the reference DHCP/TFTP server
    isc-dhcp-client tftp-hpa curl tcpdump  # plain clients and troubleshooting
    socat                                  # the demo: the lab's web UI on this host's loopback
    python3                                # HTTP server and UDP listener of the selftest
)
LAB_BRIDGE=${LAB_BRIDGE:-br0}
LAB_ULA=${LAB_ULA:-fd99::1/64}
export LAB_CACHE=${TB_LAB_CACHE:-/var/cache/tinkerbox-lab}
# The repository this lib.sh belongs to.
LAB_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

lab_log() { printf '[lab] %s\n' "$*" >&2; }

# lab_install_packages [PKG...] : installs what is missing (default:
# LAB_PACKAGES) through tests/apt-install (QEMU as one consistent set).
lab_install_packages() {
    if (($#)); then
        "$LAB_REPO/tests/apt-install" "$@"
    else
        "$LAB_REPO/tests/apt-install" "${LAB_PACKAGES[@]}"
    fi
}

lab_ns_exists() { [[ -e /run/netns/$1 ]]; }

# lab_up NS BRIDGE_CIDR : namespace NS with lo up and bridge br0 holding
# BRIDGE_CIDR (e.g. 10.99.0.1/24) and the ULA $LAB_ULA (nodad), up.
lab_up() {
    local ns=${1:?lab_up NS BRIDGE_CIDR} cidr=${2:?lab_up NS BRIDGE_CIDR}
    lab_ns_exists "$ns" || ip netns add "$ns"
    ip -n "$ns" link set lo up
    if ! ip -n "$ns" link show "$LAB_BRIDGE" >/dev/null 2>&1; then
        ip -n "$ns" link add "$LAB_BRIDGE" type bridge forward_delay 0 stp_state 0
    fi
    ip -n "$ns" addr replace "$cidr" dev "$LAB_BRIDGE"
    ip -n "$ns" -6 addr replace "$LAB_ULA" dev "$LAB_BRIDGE" nodad
    ip -n "$ns" link set "$LAB_BRIDGE" up
}

# lab_tap NS TAPNAME : tap device in NS, enslaved to br0, up. QEMU opens it
# from inside the namespace (ip netns exec NS qemu-system-x86_64 ...).
lab_tap() {
    local ns=${1:?lab_tap NS TAP} tap=${2:?lab_tap NS TAP}
    if ! ip -n "$ns" link show "$tap" >/dev/null 2>&1; then
        ip -n "$ns" tuntap add dev "$tap" mode tap
    fi
    ip -n "$ns" link set "$tap" master "$LAB_BRIDGE" up
}

# lab_veth NS CLIENTNS : namespace CLIENTNS (created) whose eth0 is a veth
# whose peer is enslaved to br0 in NS. Both ends up, no address.
lab_veth() {
    local ns=${1:?lab_veth NS CLIENTNS} cns=${2:?lab_veth NS CLIENTNS}
    local host="v-${cns:0:13}"
    lab_ns_exists "$cns" || ip netns add "$cns"
    ip -n "$cns" link set lo up
    if ! ip -n "$ns" link show "$host" >/dev/null 2>&1; then
        ip -n "$cns" link del eth0 2>/dev/null || true
        ip -n "$ns" link add "$host" type veth peer name eth0 netns "$cns"
    fi
    ip -n "$ns" link set "$host" master "$LAB_BRIDGE" up
    ip -n "$cns" link set eth0 up
}

# lab_kill_pid PID... : TERM, up to 5 s grace, then KILL; reaps children.
lab_kill_pid() {
    local pid i
    for pid in "$@"; do
        [[ $pid =~ ^[0-9]+$ ]] || continue
        kill -TERM "$pid" 2>/dev/null || continue
        for ((i = 0; i < 50; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) == Z ]] && break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    return 0
}

# lab_down NS [CLIENTNS...] : kills every process still inside those
# namespaces, then deletes them. Works on half-built labs and missing ones.
lab_down() {
    local ns pids
    for ns in "$@"; do
        lab_ns_exists "$ns" || continue
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        if [[ -n $pids ]]; then
            lab_log "stopping processes left in $ns: $(echo "$pids" | tr '\n' ' ')"
            # shellcheck disable=SC2086 # one PID per word
            lab_kill_pid $pids
        fi
        ip netns del "$ns" 2>/dev/null || true
    done
    return 0
}

# lab_wait_log FILE PATTERN TIMEOUT_S [PID] : polls FILE (every 0.2 s) for the
# extended regex PATTERN. 0 when found, 1 on timeout, 2 when PID (optional)
# exited without the pattern showing up.
lab_wait_log() {
    local file=$1 pattern=$2 timeout=$3 pid=${4:-}
    local deadline=$((SECONDS + timeout))
    while :; do
        grep -Eq -- "$pattern" "$file" 2>/dev/null && return 0
        if [[ -n $pid ]] && ! kill -0 "$pid" 2>/dev/null; then
            grep -Eq -- "$pattern" "$file" 2>/dev/null && return 0
            return 2
        fi
        ((SECONDS < deadline)) || return 1
        sleep 0.2
    done
}

# lab_sercon_file PATH : writes the 2-byte little-endian 0x3f8 (COM1) that
# SeaBIOS reads from fw_cfg etc/sercon-port to mirror its and iPXE's
# console on the serial port.
lab_sercon_file() {
    local path=${1:?lab_sercon_file PATH}
    mkdir -p "$(dirname "$path")"
    printf '\xf8\x03' >"$path.tmp.$$" && mv -f "$path.tmp.$$" "$path"
}

# lab_kube_up NS DIR PORT : an API server inside namespace NS on
# 127.0.0.1:PORT, its kubeconfig written to DIR/kubeconfig: a real
# kube-apiserver on etcd where KUBEBUILDER_ASSETS (envtest's convention;
# default /usr/local/kubebuilder/bin) has one, as the integration tests
# start it (a token for an admin, RBAC on), else kmock
# (tests/kube/kmock-server), saying so. The PIDs started are appended to
# the caller's `pids` array; LAB_KUBE_REAL is 1 for a real one, else 0.
# Every wait is bounded (90 s).
lab_kube_up() {
    local ns=${1:?lab_kube_up NS DIR PORT} dir=${2:?} port=${3:?} i
    local assets=${KUBEBUILDER_ASSETS:-/usr/local/kubebuilder/bin} repo etcd token
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    export LAB_KUBE_REAL=0
    etcd=$assets/etcd
    [[ -x $etcd ]] || etcd=/usr/bin/etcd
    if [[ -x $assets/kube-apiserver && -x $etcd ]]; then
        openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null
        token=tb-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')
        echo "$token,admin,admin,system:masters" >"$dir/tokens.csv"
        ip netns exec "$ns" "$etcd" --name default --data-dir "$dir/etcd" \
            --listen-client-urls "http://127.0.0.1:$((port + 1))" \
            --advertise-client-urls "http://127.0.0.1:$((port + 1))" \
            --listen-peer-urls "http://127.0.0.1:$((port + 2))" \
            --initial-advertise-peer-urls "http://127.0.0.1:$((port + 2))" \
            --initial-cluster "default=http://127.0.0.1:$((port + 2))" \
            </dev/null >"$dir/etcd.log" 2>&1 &
        pids+=($!)
        ip netns exec "$ns" "$assets/kube-apiserver" --etcd-servers="http://127.0.0.1:$((port + 1))" \
            --cert-dir="$dir/certs" --secure-port="$port" \
            --bind-address=127.0.0.1 --advertise-address=127.0.0.1 \
            --service-cluster-ip-range=10.0.0.0/24 --allow-privileged=true \
            --service-account-issuer=https://kubernetes.default.svc \
            --service-account-key-file="$dir/sa.key" --service-account-signing-key-file="$dir/sa.key" \
            --token-auth-file="$dir/tokens.csv" \
            --authorization-mode=RBAC --disable-admission-plugins=ServiceAccount \
            </dev/null >"$dir/kube-apiserver.log" 2>&1 &
        pids+=($!)
        cat >"$dir/kubeconfig" <<END
apiVersion: v1
kind: Config
clusters: [{name: lab, cluster: {server: "https://127.0.0.1:$port", insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: $token}}]
contexts: [{name: lab, context: {cluster: lab, user: admin, namespace: default}}]
current-context: lab
END
        for ((i = 0; i < 360; i++)); do
            ip netns exec "$ns" kubectl --kubeconfig "$dir/kubeconfig" --request-timeout 2s \
                get --raw /readyz >/dev/null 2>&1 && break
            kill -0 "${pids[-1]}" 2>/dev/null || break
            sleep 0.25
        done
        ip netns exec "$ns" kubectl --kubeconfig "$dir/kubeconfig" --request-timeout 5s \
            get --raw /readyz >/dev/null 2>&1 || {
            lab_log "kube-apiserver not ready: $(tail -n 5 "$dir/kube-apiserver.log")"
            return 1
        }
        export LAB_KUBE_REAL=1
        lab_log "the cluster: kube-apiserver from $assets on $etcd, 127.0.0.1:$port in $ns"
        return 0
    fi
    lab_log "NO kube-apiserver in $assets (KUBEBUILDER_ASSETS): the cluster is kmock, a fake API server (no schema validation, server-side apply only in part: a manager's dropped fields go, ownership is not tracked)"
    local kpy
    kpy=$("$repo/tests/kube/kmock-venv")
    ip netns exec "$ns" "$kpy" "$repo/tests/kube/kmock-server" --port "$port" </dev/null >"$dir/kmock.log" 2>&1 &
    pids+=($!)
    for ((i = 0; i < 100; i++)); do
        grep -q '^READY' "$dir/kmock.log" && break
        kill -0 "${pids[-1]}" 2>/dev/null || break
        sleep 0.1
    done
    grep -q '^READY' "$dir/kmock.log" || {
        lab_log "kmock-server not ready: $(tail -n 5 "$dir/kmock.log")"
        return 1
    }
    cat >"$dir/kubeconfig" <<END
apiVersion: v1
kind: Config
clusters: [{name: lab, cluster: {server: "http://127.0.0.1:$port"}}]
users: [{name: lab, user: {}}]
contexts: [{name: lab, context: {cluster: lab, user: lab, namespace: default}}]
current-context: lab
END
}
