"""SSH fan-out: one trivial command (`true`) on 1, 8 and 32 hosts with the launcher's fan-out
(`fdbench fanout`: ssh2 sessions on their own threads, as a launch contacts its nodes) against
`pdsh -R ssh` (one OpenSSH client process per host) on the same hosts.

The hosts are loopback addresses 127.0.0.10–41, each with its own `sshd` (key authentication,
host keys checked against a known_hosts file made here)."""

import os
import shutil
import subprocess
import tempfile
import time

from common import Proc, alternate, clean_env, cmd, free_port, med, repetitions, reps, spread, table

COUNTS = (1, 8, 32)
FIRST_ADDR = 10


def addr(i):
    return f"127.0.0.{FIRST_ADDR + i}"


class Hosts:
    """A temporary sshd on each of `n` loopback addresses, with keys, a client config and a
    known_hosts that trusts them; `close()` stops them and removes everything."""

    def __init__(self, n):
        for tool in ("/usr/sbin/sshd", shutil.which("ssh-keygen"), shutil.which("pdsh"), shutil.which("ssh")):
            if not tool or not os.path.exists(tool):
                raise RuntimeError("fanout needs sshd, ssh, ssh-keygen and pdsh: run scripts/install-deps.sh")
        self.dir = tempfile.mkdtemp(prefix="fdfan")
        self.port = free_port()
        self.n = n
        host_key, client_key = self.path("host_ed25519"), self.path("id_ed25519")
        for key in (host_key, client_key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], check=True)
        shutil.copy(client_key + ".pub", self.path("authorized_keys"))
        os.makedirs(self.path("home"))
        for i in range(n):
            with open(self.path(f"sshd{i}.conf"), "w") as f:
                f.write(
                    f"ListenAddress {addr(i)}:{self.port}\nHostKey {host_key}\nPidFile {self.path(f'sshd{i}.pid')}\n"
                    f"AuthorizedKeysFile {self.path('authorized_keys')}\nUsePAM no\nStrictModes no\n"
                    "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
                    "LogLevel ERROR\n"
                    # An empty home for the sessions: the machine's ~/.bashrc (which Debian's bash
                    # reads for commands over SSH) runs `pyenv init`, whose rehash races itself
                    # when 32 sessions start at once and fails the command now and then.
                    f"SetEnv HOME={self.path('home')}\n"
                )
        public = open(host_key + ".pub").read().split()
        with open(self.path("known_hosts"), "w") as f:
            f.writelines(f"[{addr(i)}]:{self.port} {public[0]} {public[1]}\n" for i in range(n))
        with open(self.path("ssh_config"), "w") as f:
            for i in range(n):
                f.write(
                    f"Host h{i}\n  HostName {addr(i)}\n  Port {self.port}\n  User root\n"
                    f"  IdentityFile {client_key}\n  UserKnownHostsFile {self.path('known_hosts')}\n"
                    "  StrictHostKeyChecking yes\n  BatchMode yes\n\n"
                )
        os.makedirs("/run/sshd", exist_ok=True)
        self.sshds = []
        try:
            for i in range(n):
                conf = self.path(f"sshd{i}.conf")
                self.sshds.append(subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", conf]))
            for i in range(n):
                self.wait_listening(i)
        except BaseException:
            self.close()
            raise

    def path(self, name):
        return os.path.join(self.dir, name)

    def wait_listening(self, i, timeout_s=30):
        """Until host i answers with an SSH banner."""
        import socket

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with socket.create_connection((addr(i), self.port), timeout=1) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return
            except OSError:
                pass
            if self.sshds[i].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the benchmark's sshd did not listen on {addr(i)}:{self.port}")
            time.sleep(0.05)

    def names(self, n):
        return [f"h{i}" for i in range(n)]

    def close(self):
        for sshd in self.sshds:
            sshd.terminate()
        for sshd in self.sshds:
            sshd.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def fd_argv(tools, hosts, n):
    return [tools.fdbench, "fanout", hosts.path("ssh_config"), ",".join(hosts.names(n)), "true"]


def pdsh_argv(n, names):
    return ["pdsh", "-R", "ssh", "-f", str(max(n, 1)), "-w", ",".join(names), "true"]


def pdsh_env(hosts):
    # pdsh starts `ssh -2 -a -x -l USER HOST ...`; the config supplies address, port, key, trust.
    return clean_env({"PDSH_SSH_ARGS_APPEND": f"-F {hosts.path('ssh_config')}"})


def one(side, tools, hosts, n):
    """Returns (wall ms, fan-out ms or None)."""
    t0 = time.perf_counter()
    if side == "fd":
        p = Proc.start(fd_argv(tools, hosts, n), clean_env({})).wait(120, f"fdbench fanout {n}")
        wall = (time.perf_counter() - t0) * 1e3
        import json

        got = [json.loads(line) for _, line in p.lines if line.startswith("{")][-1]
        if got["ok"] != n:
            raise RuntimeError(f"fdbench fanout on {n} hosts: {got['failures']}")
        return wall, got["fanout_ms"]
    p = Proc.start(pdsh_argv(n, hosts.names(n)), pdsh_env(hosts)).wait(120, f"pdsh on {n} hosts")
    wall = (time.perf_counter() - t0) * 1e3
    if p.err:
        raise RuntimeError(f"pdsh on {n} hosts: {p.stderr()[-800:]}")
    return wall, None


def run(tools, deadline, out=print):
    wanted = reps("BENCH_REPS", 7)
    hosts = Hosts(max(COUNTS))
    rows = []
    try:
        for i, n in enumerate(COUNTS):
            share = time.monotonic() + (deadline - time.monotonic()) / (len(COUNTS) - i)
            got = {"fd": [], "fd_fanout": [], "ref": []}
            for rep in repetitions(wanted, share):
                for side in alternate(rep):
                    wall, inner = one(side, tools, hosts, n)
                    got[side].append(wall)
                    if inner is not None:
                        got["fd_fanout"].append(inner)
                out(f"  fanout {n} hosts rep {rep + 1}: fd {got['fd'][-1]:.0f} ms (fan-out {got['fd_fanout'][-1]:.0f}), pdsh {got['ref'][-1]:.0f} ms")
            ratio_fanout = med(got["ref"]) / med(got["fd_fanout"])
            ratio_wall = med(got["ref"]) / med(got["fd"])
            target = ("met" if ratio_fanout >= 1.0 else "**missed**") if n == max(COUNTS) else "(reported)"
            rows.append(
                [
                    n,
                    spread(got["fd_fanout"], "{:,.0f}"),
                    spread(got["fd"], "{:,.0f}"),
                    spread(got["ref"], "{:,.0f}"),
                    f"**{ratio_fanout:.2f}**",
                    f"{ratio_wall:.2f}",
                    target,
                    len(got["ref"]),
                ]
            )
    finally:
        hosts.close()
    header = [
        "hosts",
        "Flightdeck fan-out ms",
        "fdbench process ms",
        "pdsh ms",
        "ratio (pdsh ÷ fan-out)",
        "ratio (pdsh ÷ process)",
        "target (32 hosts: ≥ 1.0)",
        "reps",
    ]
    note = (
        "\n\nFan-out is what a launch pays (the server is already running): connect, check the host "
        "key, authenticate, run `true`, on every host in parallel. The process column adds "
        "`fdbench`'s own start (it links libtorch: the difference between the two columns), which a "
        "launch never pays; pdsh is "
        "timed as a whole process, as a user runs it. Each host has its own sshd, all on this "
        "machine's 2 cores, so both sides also pay the servers' per-connection cost."
    )
    repro = [
        f"- Flightdeck: `{cmd(['fdbench', 'fanout', 'SSH_CONFIG', 'h0,h1,...', 'true'])}`; pdsh: "
        f"`{cmd(['pdsh', '-R', 'ssh', '-f', 'N', '-w', 'h0,h1,...', 'true'], {'PDSH_SSH_ARGS_APPEND': '-F SSH_CONFIG'})}` "
        "(benches/driver/fanout.py writes the sshd and client configs)"
    ]
    return table(header, rows) + note, repro, wanted
