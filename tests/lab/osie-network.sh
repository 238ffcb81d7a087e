# shellcheck shell=sh
# The lab's network hook for osie/init (tests/lab/build-artifacts puts it at
# /etc/osie.d/network/50-lab.sh; sourced once DHCP has given an address, before
# the agent): fetches a few URLs, sends one syslog line, and either powers off
# (tb_agent=0, or no grpc_authority: the boot labs) or lets osie/init run
# tinkerbox-agent (the install labs). Kernel command line read: hw_addr=
# worker_id= syslog_host= tb_probe= (may be repeated), grpc_authority=,
# tb_agent= and tb_ref_write=URL: before the agent starts, the reference for
# its image2disk speed, `wget -O- URL | gunzip | dd of=/dev/vda conv=fsync` of
# the same image in the same machine. With syslog_host=H it also fetches
# H:7080's /2009-04-04/meta-data/instance-id and /2009-04-04/user-data.
# Every network step is bounded. Stage lines: see osie-early.sh.
# Note: Debian's busybox wget has no -T (it segfaults on it): use timeout.

lab_stage() { echo "TB-STAGE $*"; }
lab_off() {
    lab_stage poweroff
    sync
    sleep 0.3 # let the UART drain the last line
    poweroff -f
    echo o >/proc/sysrq-trigger
    while :; do sleep 60; done
}

set -f # no globbing of command line words
lab_hw_addr="" lab_worker_id="" lab_syslog_host="" lab_probes="" lab_grpc="" lab_agent=1 lab_ref_write=""
# shellcheck disable=SC2013 # words, not lines
for word in $(cat /proc/cmdline); do
    case $word in
    hw_addr=*) lab_hw_addr=${word#hw_addr=} ;;
    worker_id=*) lab_worker_id=${word#worker_id=} ;;
    syslog_host=*) lab_syslog_host=${word#syslog_host=} ;;
    tb_probe=*) lab_probes="$lab_probes ${word#tb_probe=}" ;;
    grpc_authority=*) lab_grpc=${word#grpc_authority=} ;;
    tb_agent=*) lab_agent=${word#tb_agent=} ;;
    tb_ref_write=*) lab_ref_write=${word#tb_ref_write=} ;;
    esac
done
set +f

lab_ip=""
[ -s /run/osie-lease ] && read -r _ lab_ip </run/osie-lease
lab_stage "dhcp ip=$lab_ip"
lab_stage "cmdline hw_addr=$lab_hw_addr worker_id=$lab_worker_id"

lab_fetch() {
    rm -f /tmp/body
    if timeout 5 wget -q -O /tmp/body "$1" 2>/dev/null; then st=ok; else st=fail; fi
    body=""
    [ -s /tmp/body ] && body=$(head -n 1 /tmp/body | tr -d '\r')
    lab_stage "fetch url=$1 status=$st body=$body"
}
for url in $lab_probes; do lab_fetch "$url"; done
if [ -n "$lab_syslog_host" ]; then
    lab_fetch "http://$lab_syslog_host:7080/2009-04-04/meta-data/instance-id"
    lab_fetch "http://$lab_syslog_host:7080/2009-04-04/user-data"
fi

# syslog: busybox nc has no UDP, so syslogd -R forwards logger's line.
if [ -n "$lab_syslog_host" ] && [ -n "$lab_ip" ]; then
    syslogd -n -R "$lab_syslog_host:514" &
    sl=$!
    i=0
    while [ ! -S /dev/log ] && [ $i -lt 20 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    logger -p user.info -t tb-lab "hello from $lab_hw_addr worker_id=$lab_worker_id"
    sleep 0.5 # syslogd forwards asynchronously
    kill "$sl" 2>/dev/null
    lab_stage "syslog host=$lab_syslog_host sent"
fi

if [ -n "$lab_ref_write" ] && [ -b /dev/vda ]; then
    t0=$(cut -d' ' -f1 /proc/uptime)
    wget -q -O- "$lab_ref_write" | gunzip | dd of=/dev/vda bs=4194304 conv=fsync 2>/tmp/dd.err
    t1=$(cut -d' ' -f1 /proc/uptime)
    lab_stage "refwrite url=$lab_ref_write seconds=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')"
fi

if [ -z "$lab_grpc" ] || [ "$lab_agent" = 0 ] || [ ! -x /bin/tinkerbox-agent ]; then
    lab_off
fi
kill "$(cat /run/tb-lab-watchdog)" 2>/dev/null
lab_stage "agent server=$lab_grpc worker_id=$lab_worker_id"
