"""Flightdeck telemetry for Python ranks: standard library only.

A rank started by Flightdeck (kind = "command") finds the node agent's socket in
FLIGHTDECK_TELEMETRY. Report steps and phases so the cockpit, the history and hang detection
see this rank like a native one:

    from flightdeck_telemetry import Telemetry
    tele = Telemetry()               # no-op when not started by Flightdeck
    for step in range(1, steps + 1):
        tele.phase(step, "fwd")
        ...
        tele.step(step, loss=loss.item(), lr=lr, tokens=tokens, step_time_ms=ms)
    tele.finished(steps, final_loss)

The wire format is JSON lines: a Hello object, then messages shaped like the Rust enum
`RankMsg` in serde's form ({"Register": {...}}, {"Phase": {...}}, {"Step": {...}}).
"""
import json
import os
import socket
import time

PROTOCOL_VERSION = 12  # src/protocol/message.rs PROTOCOL_VERSION
PHASES = ("init", "data", "fwd", "bwd", "comm", "opt", "ckpt", "eval", "done")


class Telemetry:
    def __init__(self, path=None, rank=None):
        self.path = path or os.environ.get("FLIGHTDECK_TELEMETRY")
        self.rank = int(os.environ.get("RANK", "0")) if rank is None else rank
        self.sock = None
        if not self.path:
            return
        try:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(self.path)
        except OSError as e:
            print(f"flightdeck telemetry: cannot reach {self.path}: {e}; training on", flush=True)
            self.sock = None
            return
        node = os.environ.get("FLIGHTDECK_NODE", "local")
        self._send({"protocol_version": PROTOCOL_VERSION, "node": node, "agent_version": "python", "role": "rank"})
        self._send({"Register": {"rank": self.rank, "pid": os.getpid()}})

    def _send(self, obj):
        if self.sock is None:
            return
        try:
            self.sock.sendall((json.dumps(obj) + "\n").encode())
        except OSError:
            self.sock = None  # the agent is gone; keep training

    def phase(self, step, phase):
        if phase not in PHASES:
            raise ValueError(f"phase {phase!r} is not one of {PHASES}")
        self._send({"Phase": {"step": step, "phase": phase, "t_ms": int(time.time() * 1000)}})

    def step(self, step, loss, **metrics):
        self._send({"Step": dict(metrics, step=step, loss=float(loss))})

    def finished(self, steps, final_loss):
        self._send({"Finished": {"steps": steps, "final_loss": float(final_loss)}})

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None
