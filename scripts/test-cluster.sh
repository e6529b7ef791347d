#!/usr/bin/env bash
# A real single-node SLURM test cluster, reachable over SSH, all under one
# scratch directory, for the orchestrator's cluster integration tests.
#
#   scripts/test-cluster.sh up        install packages if missing, start everything, write $DIR/env
#   scripts/test-cluster.sh down      stop everything this script started (by pid file)
#   scripts/test-cluster.sh env       print the env file (source it, or `eval "$(… env)"`)
#   scripts/test-cluster.sh status    which daemons are up
#   scripts/test-cluster.sh restart-sshd | restart-slurmctld | stop-slurmctld | start-slurmctld
#   scripts/test-cluster.sh bastion-stop | bastion-start   the jump host (sessions through it die too)
#   scripts/test-cluster.sh stop-slurmrestd | start-slurmrestd   SLURM's REST API
#   scripts/test-cluster.sh token SECONDS   print a fresh JWT for this user (lifespan SECONDS)
#   scripts/test-cluster.sh pause-slurmctld | resume-slurmctld   SIGSTOP / SIGCONT the controller
#   scripts/test-cluster.sh lag-start SRC DST SECONDS | lag-stop  DST shows SRC as it was SECONDS ago
#   scripts/test-cluster.sh clean     down, then remove the scratch directory
#
# What runs (non-default loopback ports, nothing from /etc is changed, no systemd):
#   munged (own key and socket), MariaDB (own datadir), slurmdbd (accounting, so
#   `sacct` works), slurmctld + slurmd (one node `sweepnode`, 8 CPUs, 8 fake GPUs:
#   character devices made with `mknod c 195 N`, declared in gres.conf `File=`),
#   sshd on 127.0.0.1 with a generated host key, a generated user key and a
#   known_hosts file for it; a second sshd as bastion (jump host: forwarding to
#   the node's sshd only, its own host key in the same known_hosts), and an ssh
#   config whose host `sweeptest-jump` reaches the node through it (ProxyJump);
#   slurmrestd on 127.0.0.1 (JWT auth: AuthAltTypes=auth/jwt with a generated
#   key; a token for this user in $DIR/rest/token, mode 0600).
#
# Why everything is started by hand: CI containers have no systemd, and the
# daemons must not collide with a system SLURM or with another engineer's.
#
# Environment: SWEEP_TEST_CLUSTER_DIR (default /tmp/sweep-test-cluster),
# SWEEP_TEST_PORT_BASE (default 16810: ctld +7, slurmd +8, dbd +9, mysql +3, sshd +2,
# bastion sshd +11, slurmrestd +12, slurmrestd behind TLS +13).
set -euo pipefail

DIR=${SWEEP_TEST_CLUSTER_DIR:-/tmp/sweep-test-cluster}
BASE=${SWEEP_TEST_PORT_BASE:-16810}
SSH_PORT=$((BASE + 2))
MYSQL_PORT=$((BASE + 3))
CTLD_PORT=$((BASE + 7))
SLURMD_PORT=$((BASE + 8))
DBD_PORT=$((BASE + 9))
BASTION_PORT=$((BASE + 11))
REST_PORT=$((BASE + 12))
REST_TLS_PORT=$((BASE + 13))
# The REST API version Debian bookworm's slurmrestd (Slurm 22.05) serves.
REST_PLUGINS=openapi/v0.0.38,openapi/dbv0.0.38
CLUSTER=sweeptest
NODE=sweepnode
NGPUS=8
# socat: the ProxyCommand of the jump tests.
# slurmrestd + slurm-wlm-jwt-plugin: the REST transport's tests; curl: its readiness check;
# openssl: the site CA of its https front (socat terminates the TLS).
PACKAGES=(slurmctld slurmd slurm-client slurmdbd mariadb-server munge openssh-server socat
    slurmrestd slurm-wlm-jwt-plugin curl openssl)

CONF=$DIR/etc
MUNGE_SOCKET=$DIR/munge/munge.socket.2
MYSQL_SOCKET=$DIR/mysql/mysqld.sock
JWT_KEY=$DIR/slurm/jwt.key
export SLURM_CONF=$CONF/slurm.conf

log() { printf '[test-cluster %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Is the daemon behind this pid file alive?
alive() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# wait_for DESCRIPTION TRIES COMMAND...: retry a readiness probe every 0.25 s.
wait_for() {
    local what=$1 tries=$2
    shift 2
    local i
    for ((i = 0; i < tries; i++)); do
        # Bounded per attempt too: SLURM clients retry a dead peer for a long time.
        if timeout 5 "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.25
    done
    log "$what not ready after $((tries / 4)) s; last attempt said:"
    timeout 5 "$@" >&2 || true
    return 1
}

stop_pidfile() {
    local name=$1 pidfile=$2 i
    if alive "$pidfile"; then
        local pid
        pid=$(cat "$pidfile")
        kill "$pid" 2>/dev/null || true
        for ((i = 0; i < 80; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.25
        done
        if kill -0 "$pid" 2>/dev/null; then
            log "$name ($pid) ignored SIGTERM; SIGKILL"
            kill -9 "$pid" 2>/dev/null || true
        fi
        log "stopped $name"
    fi
    rm -f "$pidfile"
}

install_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
    done
    if ((${#missing[@]})); then
        [[ $(id -u) == 0 ]] || die "packages missing (${missing[*]}) and not root"
        log "installing ${missing[*]}"
        apt-get update -qq
        # policy-rc.d keeps the packages' init scripts from starting system daemons.
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

write_configs() {
    mkdir -p "$CONF" "$DIR"/{munge,mysql,log,run,slurm/state,slurm/spool,dev,ssh,work,rest}
    chmod 700 "$DIR/munge" "$DIR/rest"
    # The JWT signing key (HS256): 32 random bytes, readable by the daemons only.
    [[ -s $JWT_KEY ]] || (umask 077 && dd if=/dev/urandom bs=32 count=1 of="$JWT_KEY" status=none)
    chmod 600 "$JWT_KEY"
    local cpus=8 host
    host=$(hostname -s)
    # Fake GPUs: character devices with the NVIDIA major number; slurmd only stats them.
    local i
    for ((i = 0; i < NGPUS; i++)); do
        [[ -e $DIR/dev/nvidia$i ]] || mknod "$DIR/dev/nvidia$i" c 195 "$i"
    done
    cat >"$CONF/slurm.conf" <<EOF
# Generated by scripts/test-cluster.sh: single-node test cluster.
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
# cred_expire: also how long a requeued job waits before it may start again
# (120 s by default); short, so a chained run's segments follow each other
# in seconds in the chain tests.
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
# JWT next to munge: slurmrestd passes the tokens of REST clients through.
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$JWT_KEY
StateSaveLocation=$DIR/slurm/state
SlurmdSpoolDir=$DIR/slurm/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
LaunchParameters=use_interactive_step
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
# Small on purpose: a 120-config sweep must be split into several arrays.
MaxArraySize=100
MaxJobCount=100000
MinJobAge=600
ReturnToService=2
SlurmctldTimeout=30
# Short, so a stalled controller (pause-slurmctld) makes sbatch/squeue time out in seconds.
MessageTimeout=5
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
Waittime=0
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
# Clients talk to slurmdbd with this munge socket, not AuthInfo's.
AccountingStoragePass=$MUNGE_SOCKET
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# sacct shows --comment (experiment and config hashes) only with this flag.
AccountingStoreFlags=job_comment
MpiDefault=none
NodeName=$NODE NodeHostname=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=8000 Gres=gpu:$NGPUS State=UNKNOWN
PartitionName=gpu Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
    cat >"$CONF/gres.conf" <<EOF
NodeName=$NODE Name=gpu File=$DIR/dev/nvidia[0-$((NGPUS - 1))]
EOF
    # No cgroup.conf: proctrack/linuxproc + task/none need no cgroups (containers lack them).
    rm -f "$CONF/cgroup.conf"
    cat >"$CONF/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$JWT_KEY
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$DIR/run/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$MYSQL_PORT
StorageUser=slurm
StoragePass=sweeptest
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$CONF/slurmdbd.conf"
}

start_munge() {
    if alive "$DIR/run/munged.pid"; then return; fi
    [[ -s $DIR/munge/munge.key ]] || {
        dd if=/dev/urandom bs=1 count=1024 of="$DIR/munge/munge.key" status=none
        chmod 400 "$DIR/munge/munge.key"
    }
    munged --force --key-file="$DIR/munge/munge.key" --socket="$MUNGE_SOCKET" \
        --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
        --seed-file="$DIR/munge/munged.seed"
    wait_for munge 40 bash -c "munge -S '$MUNGE_SOCKET' -n | unmunge -S '$MUNGE_SOCKET'"
    log "munged up"
}

start_mysql() {
    if alive "$DIR/run/mysqld.pid"; then return; fi
    if [[ ! -d $DIR/mysql/data/mysql ]]; then
        mariadb-install-db --no-defaults --user=root --datadir="$DIR/mysql/data" \
            --auth-root-authentication-method=socket --skip-test-db >"$DIR/log/mysql-install.log" 2>&1 ||
            die "mariadb-install-db failed, see $DIR/log/mysql-install.log"
    fi
    (mariadbd --no-defaults --user=root --datadir="$DIR/mysql/data" --socket="$MYSQL_SOCKET" \
        --port="$MYSQL_PORT" --bind-address=127.0.0.1 --pid-file="$DIR/run/mysqld.pid" \
        --log-error="$DIR/log/mysqld.log" --innodb-buffer-pool-size=64M \
        --innodb-log-file-size=16M --skip-name-resolve </dev/null >/dev/null 2>&1 &)
    wait_for mariadb 120 mariadb-admin --no-defaults --socket="$MYSQL_SOCKET" ping
    mariadb --no-defaults --socket="$MYSQL_SOCKET" -u root <<'EOF'
CREATE USER IF NOT EXISTS 'slurm'@'%' IDENTIFIED BY 'sweeptest';
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'%';
FLUSH PRIVILEGES;
EOF
    log "mariadb up"
}

# A daemon that answered the readiness check must be ours: one that died on a
# busy port (a leftover from an earlier run) would otherwise pass the check
# through the stranger, and every later stop/restart would miss it.
own_daemon() {
    local name=$1 pidfile=$2 port=$3
    sleep 0.5
    alive "$pidfile" && return
    tail -3 "$DIR/log/$name.log" >&2
    die "$name exited after starting; is another process using port $port? (ss -ltnp | grep :$port)"
}

start_slurmdbd() {
    if alive "$DIR/run/slurmdbd.pid"; then return; fi
    slurmdbd || { tail -5 "$DIR/log/slurmdbd.log" >&2; die "slurmdbd did not start"; }
    wait_for slurmdbd 120 sacctmgr -n -P show cluster
    own_daemon slurmdbd "$DIR/run/slurmdbd.pid" "$DBD_PORT"
    if ! sacctmgr -n -P show cluster format=cluster | grep -qx "$CLUSTER"; then
        sacctmgr -i add cluster "$CLUSTER" >/dev/null
    fi
    log "slurmdbd up"
}

start_slurmctld() {
    if alive "$DIR/run/slurmctld.pid"; then return; fi
    slurmctld || { tail -5 "$DIR/log/slurmctld.log" >&2; die "slurmctld did not start"; }
    wait_for slurmctld 120 scontrol ping
    own_daemon slurmctld "$DIR/run/slurmctld.pid" "$CTLD_PORT"
    log "slurmctld up"
}

start_slurmd() {
    if ! alive "$DIR/run/slurmd.pid"; then
        slurmd -N "$NODE" || { tail -5 "$DIR/log/slurmd.log" >&2; die "slurmd did not start"; }
    fi
    # The node may come back DOWN after a crash: ReturnToService=2 revives it once
    # slurmd registers; wait until it can take jobs.
    wait_for "slurmd registration" 120 bash -c \
        "sinfo -h -n $NODE -o %T | grep -Eq '^(idle|mixed|allocated)'" || {
        scontrol update nodename=$NODE state=resume >/dev/null 2>&1 || true
        wait_for "slurmd registration" 40 bash -c "sinfo -h -n $NODE -o %T | grep -Eq '^(idle|mixed|allocated)'"
    }
    log "slurmd up (node $NODE $(sinfo -h -n $NODE -o %T))"
}

ssh_keys() {
    local ssh=$DIR/ssh
    [[ -s $ssh/host_ed25519 ]] || ssh-keygen -q -t ed25519 -N '' -C sweep-test-host -f "$ssh/host_ed25519"
    [[ -s $ssh/id_ed25519 ]] || ssh-keygen -q -t ed25519 -N '' -C sweep-test-user -f "$ssh/id_ed25519"
    # A second, never-served host key: tests use it to fake a changed host key.
    [[ -s $ssh/other_host_ed25519 ]] || ssh-keygen -q -t ed25519 -N '' -C sweep-test-other -f "$ssh/other_host_ed25519"
    cp "$ssh/id_ed25519.pub" "$ssh/authorized_keys"
    chmod 600 "$ssh/authorized_keys"
    printf '[127.0.0.1]:%s %s\n' "$SSH_PORT" "$(cut -d' ' -f1,2 "$ssh/host_ed25519.pub")" >"$ssh/known_hosts"
    printf '[127.0.0.1]:%s %s\n' "$SSH_PORT" "$(cut -d' ' -f1,2 "$ssh/other_host_ed25519.pub")" >"$ssh/known_hosts.changed"
    cat >"$ssh/sshd_config" <<EOF
Port $SSH_PORT
ListenAddress 127.0.0.1
HostKey $ssh/host_ed25519
PidFile $DIR/run/sshd.pid
AuthorizedKeysFile $ssh/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
Subsystem sftp internal-sftp
SetEnv SLURM_CONF=$CONF/slurm.conf
LogLevel INFO
MaxStartups 100:30:200
MaxSessions 100
EOF
    cat >"$ssh/config" <<EOF
Host sweeptest
    HostName 127.0.0.1
    Port $SSH_PORT
    User $(id -un)
    IdentityFile $ssh/id_ed25519
    UserKnownHostsFile $ssh/known_hosts
    StrictHostKeyChecking yes
EOF
    bastion_config
}

# The jump host: a second sshd that only forwards to the node's sshd. Its host
# key goes into the same known_hosts (every hop's key is verified), and the ssh
# config gains the bastion and `sweeptest-jump`, the node reached through it.
bastion_config() {
    local ssh=$DIR/ssh user
    user=$(id -un)
    [[ -s $ssh/bastion_host_ed25519 ]] || ssh-keygen -q -t ed25519 -N '' -C sweep-test-bastion -f "$ssh/bastion_host_ed25519"
    printf '[127.0.0.1]:%s %s\n' "$BASTION_PORT" "$(cut -d' ' -f1,2 "$ssh/bastion_host_ed25519.pub")" >>"$ssh/known_hosts"
    cat >"$ssh/bastion_sshd_config" <<EOF
Port $BASTION_PORT
ListenAddress 127.0.0.1
HostKey $ssh/bastion_host_ed25519
PidFile $DIR/run/bastion-sshd.pid
AuthorizedKeysFile $ssh/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
# A bastion: TCP forwarding to the node's sshd (and to itself, for a two-hop
# ProxyJump chain), nothing else.
AllowTcpForwarding local
PermitOpen 127.0.0.1:$SSH_PORT localhost:$SSH_PORT 127.0.0.1:$BASTION_PORT
X11Forwarding no
PermitTTY no
# DEBUG1 logs each forwarding (direct-tcpip) with its target: the tests read it.
LogLevel DEBUG1
MaxStartups 100:30:200
MaxSessions 100
EOF
    # In an included file, with the shared settings in a `Match host` block:
    # the directives a real ~/.ssh/config uses, read by OpenSSH (the readiness
    # check below) and by the orchestrator alike.
    mkdir -p "$ssh/config.d"
    cat >"$ssh/config.d/jump.conf" <<EOF
Host sweeptest-bastion
    HostName 127.0.0.1
    Port $BASTION_PORT
# The node as a cluster behind a jump host sees it: the bastion connects to
# HostName:Port for us.
Host sweeptest-jump
    HostName 127.0.0.1
    Port $SSH_PORT
    ProxyJump sweeptest-bastion
    ServerAliveInterval 5
    ServerAliveCountMax 3
Match host 127.0.0.1
    User $user
    IdentityFile $ssh/id_ed25519
    IdentitiesOnly yes
    UserKnownHostsFile $ssh/known_hosts
    StrictHostKeyChecking yes
EOF
    # After `Match all`: an Include inside the `Host sweeptest` block would apply to that host only.
    printf 'Match all\nInclude %s/config.d/*.conf\n' "$ssh" >>"$ssh/config"
}

start_bastion() {
    if alive "$DIR/run/bastion-sshd.pid"; then return; fi
    mkdir -p /run/sshd
    /usr/sbin/sshd -f "$DIR/ssh/bastion_sshd_config" -E "$DIR/log/bastion-sshd.log"
    # Through the bastion to the node, with OpenSSH's own client: the config is valid ssh_config.
    wait_for "bastion sshd" 60 ssh -F "$DIR/ssh/config" -o BatchMode=yes -o ConnectTimeout=2 sweeptest-jump true
    own_daemon bastion-sshd "$DIR/run/bastion-sshd.pid" "$BASTION_PORT"
    log "bastion sshd up on 127.0.0.1:$BASTION_PORT"
}

# Like a rebooted jump host: the listener and every session through it go away.
stop_bastion() {
    if alive "$DIR/run/bastion-sshd.pid"; then
        for child in $(pgrep -P "$(cat "$DIR/run/bastion-sshd.pid")" || true); do kill "$child" 2>/dev/null || true; done
    fi
    stop_pidfile bastion-sshd "$DIR/run/bastion-sshd.pid"
}

start_sshd() {
    if alive "$DIR/run/sshd.pid"; then return; fi
    mkdir -p /run/sshd
    /usr/sbin/sshd -f "$DIR/ssh/sshd_config" -E "$DIR/log/sshd.log"
    wait_for sshd 60 ssh -F "$DIR/ssh/config" -o BatchMode=yes -o ConnectTimeout=2 sweeptest true
    log "sshd up on 127.0.0.1:$SSH_PORT"
}

# A JWT for this user, valid SECONDS (the token alone, without `SLURM_JWT=`).
# SLURM_JWT must not be set here: scontrol would authenticate with it.
token() {
    local seconds=$1 out
    out=$(env -u SLURM_JWT scontrol token username="$(id -un)" lifespan="$seconds") || die "scontrol token failed"
    printf '%s\n' "${out#SLURM_JWT=}"
}

# slurmrestd on loopback. SLURM_JWT=daemon makes it hand each request's token
# on to slurmctld/slurmdbd (without it every request is refused with
# "Rejecting thread config token"); running as root needs disable_user_check.
start_slurmrestd() {
    if alive "$DIR/run/slurmrestd.pid"; then return; fi
    (umask 077 && token 31536000 >"$DIR/rest/token.new") && mv "$DIR/rest/token.new" "$DIR/rest/token"
    # The readiness check's headers come from a file (curl -H @file), never from argv.
    (umask 077 && printf 'X-SLURM-USER-NAME: %s\nX-SLURM-USER-TOKEN: %s\n' "$(id -un)" "$(cat "$DIR/rest/token")" \
        >"$DIR/rest/headers")
    (
        export SLURM_JWT=daemon SLURMRESTD_SECURITY=disable_user_check
        exec slurmrestd -a rest_auth/jwt -s "$REST_PLUGINS" "127.0.0.1:$REST_PORT" \
            </dev/null >>"$DIR/log/slurmrestd.log" 2>&1
    ) &
    echo $! >"$DIR/run/slurmrestd.pid"
    wait_for slurmrestd 120 curl -fsS -H "@$DIR/rest/headers" "http://127.0.0.1:$REST_PORT/slurm/v0.0.38/ping"
    own_daemon slurmrestd "$DIR/run/slurmrestd.pid" "$REST_PORT"
    log "slurmrestd up on 127.0.0.1:$REST_PORT"
}

# A site's https front for slurmrestd, signed by the site's own CA (what the
# `ca_file` of a rest cluster is for): a CA and a server certificate for
# 127.0.0.1 generated once, socat terminating TLS in front of slurmrestd.
tls_certs() {
    local t=$DIR/rest/tls
    [[ -s $t/server.pem && -s $t/ca.pem ]] && return
    mkdir -p "$t"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
        -subj "/CN=sweeptest site CA" -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" -keyout "$t/ca.key" -out "$t/ca.pem" 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=127.0.0.1" \
        -keyout "$t/server.key" -out "$t/server.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >"$t/ext"
    openssl x509 -req -in "$t/server.csr" -CA "$t/ca.pem" -CAkey "$t/ca.key" -CAcreateserial -days 3650 \
        -extfile "$t/ext" -out "$t/server.crt" 2>/dev/null
    (umask 077 && cat "$t/server.crt" "$t/server.key" >"$t/server.pem")
}

start_rest_tls() {
    if alive "$DIR/run/rest-tls.pid"; then return; fi
    tls_certs
    socat "OPENSSL-LISTEN:$REST_TLS_PORT,bind=127.0.0.1,reuseaddr,fork,cert=$DIR/rest/tls/server.pem,verify=0" \
        "TCP:127.0.0.1:$REST_PORT" </dev/null >>"$DIR/log/rest-tls.log" 2>&1 &
    echo $! >"$DIR/run/rest-tls.pid"
    wait_for rest-tls 80 curl -fsS --cacert "$DIR/rest/tls/ca.pem" -H "@$DIR/rest/headers" \
        "https://127.0.0.1:$REST_TLS_PORT/slurm/v0.0.38/ping"
    own_daemon rest-tls "$DIR/run/rest-tls.pid" "$REST_TLS_PORT"
    log "slurmrestd behind TLS on https://127.0.0.1:$REST_TLS_PORT (CA $DIR/rest/tls/ca.pem)"
}

write_env() {
    local user
    user=$(id -un)
    cat >"$DIR/env" <<EOF
# Written by scripts/test-cluster.sh up; read by orchestrator/tests/cluster_*.rs.
export SWEEP_TEST_CLUSTER_DIR=$DIR
export SLURM_CONF=$CONF/slurm.conf
export SWEEP_TEST_SSH_HOST=127.0.0.1
export SWEEP_TEST_SSH_PORT=$SSH_PORT
export SWEEP_TEST_SSH_USER=$user
export SWEEP_TEST_SSH_KEY=$DIR/ssh/id_ed25519
export SWEEP_TEST_KNOWN_HOSTS=$DIR/ssh/known_hosts
export SWEEP_TEST_KNOWN_HOSTS_CHANGED=$DIR/ssh/known_hosts.changed
export SWEEP_TEST_SSH_CONFIG=$DIR/ssh/config
export SWEEP_TEST_BASTION_PORT=$BASTION_PORT
export SWEEP_TEST_BASTION_LOG=$DIR/log/bastion-sshd.log
export SWEEP_TEST_WORK_DIR=$DIR/work
export SWEEP_TEST_SCRIPT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/test-cluster.sh
export SWEEP_TEST_REST_URL=http://127.0.0.1:$REST_PORT
export SWEEP_TEST_REST_TOKEN_FILE=$DIR/rest/token
export SWEEP_TEST_REST_TLS_URL=https://127.0.0.1:$REST_TLS_PORT
export SWEEP_TEST_REST_CA=$DIR/rest/tls/ca.pem
EOF
    cat >"$DIR/clusters.yaml" <<EOF
# The test cluster, for trying the orchestrator by hand:
#   orchestrator --clusters $DIR/clusters.yaml submit EXP --cluster sweeptest
clusters:
  sweeptest:
    transport: ssh
    host: 127.0.0.1
    port: $SSH_PORT
    user: $user
    identity_file: $DIR/ssh/id_ed25519
    known_hosts: $DIR/ssh/known_hosts
    work_dir: $DIR/work
    defaults:
      partition: gpu
  sweeptest-jump:
    # The same node through the bastion (ProxyJump in the ssh config).
    transport: ssh
    host: sweeptest-jump
    ssh_config: $DIR/ssh/config
    work_dir: $DIR/work
    defaults:
      partition: gpu
  sweeptest-local-slurm:
    transport: local-slurm
    work_dir: $DIR/work
    defaults:
      partition: gpu
  sweeptest-rest:
    # SLURM through slurmrestd; this machine sees the cluster's files.
    transport: rest
    url: http://127.0.0.1:$REST_PORT
    user: $user
    token_file: $DIR/rest/token
    files: local
    # The API does not publish MaxArraySize: the clusters file says it.
    max_array_size: 100
    work_dir: $DIR/work
    defaults:
      partition: gpu
  sweeptest-rest-sftp:
    # The same API, files over SFTP through the node's sshd.
    transport: rest
    url: http://127.0.0.1:$REST_PORT
    user: $user
    token_file: $DIR/rest/token
    files: sftp
    host: 127.0.0.1
    port: $SSH_PORT
    identity_file: $DIR/ssh/id_ed25519
    known_hosts: $DIR/ssh/known_hosts
    max_array_size: 100
    work_dir: $DIR/work
    defaults:
      partition: gpu
  sweeptest-rest-tls:
    # The same API over https, its certificate signed by the site's own CA.
    transport: rest
    url: https://127.0.0.1:$REST_TLS_PORT
    ca_file: $DIR/rest/tls/ca.pem
    user: $user
    token_file: $DIR/rest/token
    files: local
    max_array_size: 100
    work_dir: $DIR/work
    defaults:
      partition: gpu
EOF
}

up() {
    local t0=$SECONDS
    install_packages
    write_configs
    start_munge
    start_mysql
    start_slurmdbd
    start_slurmctld
    start_slurmd
    ssh_keys
    start_sshd
    start_bastion
    start_slurmrestd
    start_rest_tls
    write_env
    log "cluster up in $((SECONDS - t0)) s; env: $DIR/env"
}

down() {
    stop_pidfile rest-tls "$DIR/run/rest-tls.pid"
    stop_pidfile slurmrestd "$DIR/run/slurmrestd.pid"
    stop_bastion
    lag_stop
    # A paused controller (pause-slurmctld) must run again to stop.
    if [[ -s $DIR/run/slurmctld.pid ]]; then kill -CONT "$(cat "$DIR/run/slurmctld.pid")" 2>/dev/null || true; fi
    stop_pidfile sshd "$DIR/run/sshd.pid"
    # Cancel leftover jobs so a restarted cluster does not resume old tests' work.
    if alive "$DIR/run/slurmctld.pid"; then scancel --full --quiet --user="$(id -un)" 2>/dev/null || true; fi
    stop_pidfile slurmd "$DIR/run/slurmd.pid"
    stop_pidfile slurmctld "$DIR/run/slurmctld.pid"
    stop_pidfile slurmdbd "$DIR/run/slurmdbd.pid"
    stop_pidfile mariadb "$DIR/run/mysqld.pid"
    stop_pidfile munged "$DIR/run/munged.pid"
}

# A lagging shared filesystem: every 0.5 s, SRC is snapshotted; DST is
# given the newest snapshot at least SECONDS old. So DST shows SRC as it was
# SECONDS ago (whole files, torn last lines included, like NFS attribute caching).
lag_mirror() {
    local src=$1 dst=$2 delay_ms=$3 snaps=$4 now s newest
    mkdir -p "$snaps" "$dst"
    while true; do
        now=$(date +%s%3N)
        if [[ -d $src ]]; then mkdir -p "$snaps/$now" && cp -a "$src/." "$snaps/$now/" 2>/dev/null || true; fi
        newest=
        for s in $(ls "$snaps" | sort -n); do
            if ((now - s >= delay_ms)); then
                [[ -n $newest ]] && rm -rf "${snaps:?}/$newest"
                newest=$s
            fi
        done
        if [[ -n $newest ]]; then cp -a "$snaps/$newest/." "$dst/" 2>/dev/null || true; fi
        sleep 0.5
    done
}

lag_start() {
    local src=$1 dst=$2 seconds=$3
    [[ -n $src && -n $dst && -n $seconds ]] || die "usage: $0 lag-start SRC DST SECONDS"
    lag_stop
    mkdir -p "$DIR/run"
    lag_mirror "$src" "$dst" "$((seconds * 1000))" "$DIR/lag-snapshots" </dev/null >/dev/null 2>&1 &
    echo $! >"$DIR/run/lag-mirror.pid"
    log "mirroring $src to $dst with a ${seconds} s lag (pid $!)"
}

lag_stop() {
    stop_pidfile lag-mirror "$DIR/run/lag-mirror.pid"
    rm -rf "$DIR/lag-snapshots"
}

status() {
    local d rc=0
    for d in munged mysqld slurmdbd slurmctld slurmd sshd bastion-sshd slurmrestd rest-tls; do
        if alive "$DIR/run/$d.pid"; then echo "$d up ($(cat "$DIR/run/$d.pid"))"; else echo "$d down"; rc=1; fi
    done
    return $rc
}

case ${1:-} in
up) up ;;
down) down ;;
clean) down; rm -rf "$DIR" ;;
env) [[ -s $DIR/env ]] || die "no $DIR/env: run '$0 up' first"; cat "$DIR/env" ;;
status) status ;;
restart-sshd)
    # Like a rebooted login node: the listener and every open session go away.
    if alive "$DIR/run/sshd.pid"; then
        for child in $(pgrep -P "$(cat "$DIR/run/sshd.pid")" || true); do kill "$child" 2>/dev/null || true; done
    fi
    stop_pidfile sshd "$DIR/run/sshd.pid"
    start_sshd
    ;;
stop-slurmctld) stop_pidfile slurmctld "$DIR/run/slurmctld.pid" ;;
# A stalled controller (busy, swapping): SIGSTOP/SIGCONT the real slurmctld.
pause-slurmctld) alive "$DIR/run/slurmctld.pid" || die "slurmctld is not running"; kill -STOP "$(cat "$DIR/run/slurmctld.pid")" ;;
lag-start) lag_start "${2:-}" "${3:-}" "${4:-}" ;;
lag-stop) lag_stop ;;
resume-slurmctld) [[ -s $DIR/run/slurmctld.pid ]] || die "no slurmctld pid file"; kill -CONT "$(cat "$DIR/run/slurmctld.pid")" ;;
start-slurmctld) start_slurmctld ;;
restart-slurmctld) stop_pidfile slurmctld "$DIR/run/slurmctld.pid"; start_slurmctld ;;
bastion-stop) stop_bastion ;;
bastion-start) start_bastion ;;
stop-slurmrestd) stop_pidfile slurmrestd "$DIR/run/slurmrestd.pid" ;;
start-slurmrestd) start_slurmrestd ;;
token) [[ ${2:-} =~ ^[0-9]+$ ]] || die "usage: $0 token SECONDS"; token "$2" ;;
*) echo "usage: $0 up|down|env|status|clean|restart-sshd|restart-slurmctld|stop-slurmctld|start-slurmctld|pause-slurmctld|resume-slurmctld|lag-start|lag-stop|bastion-stop|bastion-start|stop-slurmrestd|start-slurmrestd|token" >&2; exit 2 ;;
esac
