# shellcheck shell=sh
# The lab's early hook for osie/init (tests/lab/build-artifacts puts it at
# /etc/osie.d/early/50-lab.sh; sourced, before the drivers): the first of the
# lab's machine-readable stage lines on the console, and a watchdog that
# powers the machine off after 60 s whatever happens, so that no lab machine
# (and no test waiting for it) hangs. The network hook stops the watchdog when
# the agent takes over. Stage lines, in order (this hook and the next):
#   TB-STAGE init
#   TB-STAGE dhcp ip=<addr>
#   TB-STAGE cmdline hw_addr=<v> worker_id=<v>
#   TB-STAGE fetch url=<url> status=<ok|fail> body=<first line>
#   TB-STAGE syslog host=<host> sent
#   TB-STAGE refwrite url=<url> seconds=<s>
#   TB-STAGE agent server=<grpc_authority> worker_id=<v>
#   TB-STAGE poweroff
echo "TB-STAGE init"
(sleep 60 && echo "TB-STAGE watchdog" && poweroff -f) &
echo $! >/run/tb-lab-watchdog
