#!/usr/bin/env bash
# Installs the Debian packages Flightdeck's build and tests use, only those that are missing.
set -euo pipefail
need=()
have() { command -v "$1" >/dev/null 2>&1; }
have cc || need+=(build-essential)
have python3 || need+=(python3 python3-venv)
have pkg-config || need+=(pkg-config)
# The cockpit's end-to-end test drives it in tmux.
have tmux || need+=(tmux)
# Stack dumps of hung ranks: eu-stack (fast: it stops a rank for milliseconds), gdb as fallback.
have eu-stack || need+=(elfutils)
have gdb || need+=(gdb)
# ssh2 builds libssh2 against OpenSSL; the SSH tests run real sshd in network namespaces.
[ -e /usr/include/openssl/ssl.h ] || need+=(libssl-dev)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
have ssh-keygen || need+=(openssh-client)
have ip || need+=(iproute2)
# Text in `flightdeck report`'s charts (read at run time by src/report/charts.rs).
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need+=(fonts-dejavu-core)
# The SSH fan-out benchmark's reference (make bench-fanout).
have pdsh || need+=(pdsh)
# The 1,024-rank Slurm benchmark's light ranks (make bench-slurm): perl with Time::HiRes.
perl -MTime::HiRes -e 1 >/dev/null 2>&1 || need+=(perl)
# The Slurm placement's tests run a real Slurm (controller, fake nodes on loopback, munge);
# without recommends: the metapackage's 43 plugin packages are not needed.
slurm=()
have slurmctld || slurm+=(slurmctld)
have slurmd || slurm+=(slurmd)
have sbatch || slurm+=(slurm-client)
have munged || slurm+=(munge)
if [ ${#need[@]} -gt 0 ]; then
  echo "install-deps: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq "${need[@]}" >&2
fi
if [ ${#slurm[@]} -gt 0 ]; then
  echo "install-deps: installing ${slurm[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  [ ${#need[@]} -gt 0 ] || apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${slurm[@]}" >&2
fi
