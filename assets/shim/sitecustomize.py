"""Flightdeck's shim for Python ranks: no code change in the program.

The agent writes this file into the run directory and puts its folder first on PYTHONPATH of
every command rank (unless `[command] instrument = false`), so Python imports it at start-up.
It never raises into the program, and it imports nothing and starts no thread until the program
initialises torch.distributed: it wraps `init_process_group` as `torch.distributed.
distributed_c10d` is imported, and when that returns it makes the first full dump in the
program's own thread (so whatever the dumps import is imported there) and only then starts its
threads. A thread of ours that imported while the program imports can deadlock Python's module
locks into a partially initialised module (`cannot import name ... from partially initialized
module 'torch._inductor.utils'`): a tool that observes must never change the outcome. From a
daemon thread, every FLIGHTDECK_SHIM_INTERVAL_MS (default 1000), it reads the recorder's status (`_dump_fr_trace(False, False)`: each group's last enqueued and
completed sequence, microseconds) and writes

- the full dump (a *full* tick): the flight recorder's `torch._C._distributed_c10d.
  _dump_fr_trace()` (the CPU recorder, where gloo writes) into
  FLIGHTDECK_SHIM_DIR/shim_rank_<RANK>.pkl, on CUDA builds with NCCL `_dump_nccl_trace()` into
  shim_nccl_rank_<RANK>.pkl, and every Python thread's stack into shim_rank_<RANK>.stacks.json
  ({"t_ms", "pid", "threads": [{"name", "id", "main", "frames": [{"name", "file", "line"}]}]}),
  on the first tick, when the status has not moved since the last tick (a rank that waits, or
  never arrives: the verdicts need its entries and stacks) and was not dumped so yet, and for
  the collectives' records every FLIGHTDECK_SHIM_FULL_EVERY_MS (default 5000) or, when a dump
  takes longer, as often as keeps the periodic dumps' CPU time within
  FLIGHTDECK_SHIM_BUDGET_PCT of the rank's time (default 0.2: a 28 ms dump, every 14 s);
- else, when the status moved, the status alone into shim_rank_<RANK>.pkl (progress for hang
  detection; the agent names its groups from the full dumps before it);
- and what the shim has cost the rank into shim_rank_<RANK>.cost.json after each full dump and
  at exit ({"wall_ms": since torch.distributed was up, "thread_cpu_ms": its thread's CPU time and that of the
  first and last dumps, made in the program's thread,
  "full_dumps", "full_cpu_ms"}), so its share of the rank's time is a division, not a guess.

A full dump of a 2000-entry ring pickles every entry with its frames (17 to 28 ms and 250 KB on
a 2-core machine, holding the GIL; without the frames it costs the same); the status is a few
hundred bytes. Each file is written to a
temporary file and renamed, so a reader never sees half a file. A rank blocked
in a collective still dumps: PyTorch releases the GIL while it waits. It also answers on the
Unix socket FLIGHTDECK_SHIM_DIR/shim_rank_<RANK>.sock (RANK is torch.distributed.get_rank()), one line per request: "dump" (write both
now; replies with their paths), "stacks" (replies with the stacks JSON), "ping" ("pong").

`destroy_process_group()` makes one last full dump before the groups are gone.

Under `[command] launcher = "torchrun"` (FLIGHTDECK_LAUNCHER=torchrun) it also asks Linux to
SIGKILL the process when its parent dies (PR_SET_PDEATHSIG): torchrun starts each rank in a
session of its own, so a rank would otherwise outlive a torchrun killed with SIGKILL.

Last, the sitecustomize this one shadows (Debian's, a virtualenv's) is imported as if ours
were not there.
"""
import os
import sys


def _flightdeck_shim():
    """The flight-recorder dumps and the socket: `{module name: patch}` for `_flightdeck_finder`."""
    import atexit
    import functools
    import json
    import socket
    import threading
    import time
    import traceback

    out = os.environ.get("FLIGHTDECK_SHIM_DIR")
    if not out:
        return {}
    interval_s = max(0.05, int(os.environ.get("FLIGHTDECK_SHIM_INTERVAL_MS", "1000")) / 1000.0)
    full_every_s = max(interval_s, int(os.environ.get("FLIGHTDECK_SHIM_FULL_EVERY_MS", "5000")) / 1000.0)
    budget = max(0.0001, float(os.environ.get("FLIGHTDECK_SHIM_BUDGET_PCT", "0.2")) / 100.0)
    lock = threading.Lock()
    # Set once torch.distributed is up: a launcher (torchrun) or a data-loader worker spawned
    # with the same environment never initialises it, so never dumps nor takes the socket.
    where = {}

    def put(path, data):
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)

    def distributed():
        td = sys.modules.get("torch.distributed")
        try:
            return td is not None and td.is_available() and td.is_initialized()
        except Exception:
            return False  # still importing

    def stacks():
        names = {t.ident: t.name for t in threading.enumerate()}
        main = threading.main_thread().ident
        me = threading.get_ident()
        threads = []
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            frames = []
            while frame is not None and len(frames) < 128:
                code = frame.f_code
                frames.append({"name": code.co_name, "file": code.co_filename, "line": frame.f_lineno})
                frame = frame.f_back
            threads.append({"name": names.get(ident, str(ident)), "id": ident, "main": ident == main, "frames": frames})
        return json.dumps({"t_ms": int(time.time() * 1000), "pid": os.getpid(), "threads": threads}).encode()

    def dump():
        written = []
        stem, rank = where["stem"], where["rank"]
        with lock:
            put(stem + ".stacks.json", stacks())
            written.append(stem + ".stacks.json")
            if distributed():
                c10d = sys.modules["torch"]._C._distributed_c10d
                put(stem + ".pkl", c10d._dump_fr_trace())
                written.append(stem + ".pkl")
                nccl = getattr(c10d, "_dump_nccl_trace", None)
                cuda = sys.modules["torch"].cuda
                if nccl is not None and cuda.is_available() and cuda.is_initialized():
                    path = os.path.join(out, "shim_nccl_rank_" + rank + ".pkl")
                    put(path, nccl())
                    written.append(path)
        return written

    cost = {"wall_ms": 0.0, "thread_cpu_ms": 0.0, "full_dumps": 0, "full_cpu_ms": 0.0}

    def put_cost():
        if where:
            cost["wall_ms"] = round((time.monotonic() - where["since"]) * 1000.0, 3)
            put(where["stem"] + ".cost.json", json.dumps(cost).encode())

    def at_exit():
        try:
            with lock:
                put_cost()
        except Exception:
            pass

    def account(ours):
        if ours:
            where["shim_cpu_ms"] = time.thread_time() * 1000.0
        cost["thread_cpu_ms"] = round(where["program_cpu_ms"] + where["shim_cpu_ms"], 3)

    def full_dump(ours=True):
        """A full dump, accounted: the first and the last run in the program's thread (`ours`
        false), the rest in the shim's, whose CPU time is counted with theirs."""
        cpu = time.thread_time()
        dump()
        took_s = time.thread_time() - cpu
        if not ours:
            where["program_cpu_ms"] += took_s * 1000.0
        cost["full_dumps"] += 1
        cost["full_cpu_ms"] = round(cost["full_cpu_ms"] + took_s * 1000.0, 3)
        account(ours)
        with lock:
            put_cost()
        return took_s

    def periodic(first):
        complained = False
        # The status at the last tick, at the last full dump, when that was, and how long until
        # the next periodic one (longer when a dump costs more than the budget allows).
        last, dumped, dumped_at, full_s = first, first, time.monotonic(), full_every_s
        while True:
            time.sleep(interval_s)
            if not distributed():
                continue  # destroyed (or re-initialising)
            try:
                c10d = sys.modules["torch"]._C._distributed_c10d
                status = c10d._dump_fr_trace(False, False)
                now = time.monotonic()
                stalled = status == last and status != dumped
                if dumped is None or stalled or now - dumped_at >= full_s:
                    full_s = max(full_every_s, full_dump() / budget)
                    dumped, dumped_at = status, now
                elif status != last:
                    with lock:
                        put(where["stem"] + ".pkl", status)
                last = status
                account(True)
            except Exception:
                if not complained:
                    complained = True
                    sys.stderr.write("flightdeck shim: dump failed (training on):\n" + traceback.format_exc())

    def serve():
        path = where["stem"] + ".sock"
        try:
            os.unlink(path)
        except OSError:
            pass
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            srv.bind(path)
            srv.listen(4)
        except OSError as e:  # e.g. a path past the 107 bytes a socket's may have
            sys.stderr.write("flightdeck shim: no socket at %s (%s); periodic dumps go on\n" % (path, e))
            return
        while True:
            conn, _ = srv.accept()
            with conn:
                try:
                    line = conn.makefile("rb").readline().strip()
                    if line == b"dump":
                        reply = ("\n".join(dump()) + "\n").encode()
                    elif line == b"stacks":
                        reply = stacks() + b"\n"
                    elif line == b"ping":
                        reply = b"pong\n"
                    else:
                        reply = b"error: unknown request; send dump, stacks or ping\n"
                    conn.sendall(reply)
                except Exception as e:
                    try:
                        conn.sendall(("error: %s\n" % e).encode())
                    except OSError:
                        pass

    def start():
        """Once torch.distributed is up, in the thread that brought it up: the first full dump
        here, then the threads, which from then on only call what this call has imported."""
        if where or not distributed():
            return
        rank = str(sys.modules["torch.distributed"].get_rank())
        where.update(rank=rank, stem=os.path.join(out, "shim_rank_" + rank), since=time.monotonic(), program_cpu_ms=0.0, shim_cpu_ms=0.0)
        os.makedirs(out, exist_ok=True)
        atexit.register(at_exit)
        first = sys.modules["torch"]._C._distributed_c10d._dump_fr_trace(False, False)
        full_dump(ours=False)
        threading.Thread(target=periodic, args=(first,), name="flightdeck-shim", daemon=True).start()
        threading.Thread(target=serve, name="flightdeck-shim-socket", daemon=True).start()

    def last_dump():
        """Before `destroy_process_group()` takes the groups (and their records) away."""
        if where and distributed():
            full_dump(ours=False)

    def hooked(module, name, before, after):
        original = getattr(module, name, None)
        if original is None or getattr(original, "__flightdeck__", False):
            return

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            if before is not None and not args and kwargs.get("group") is None:
                quietly(before)
            result = original(*args, **kwargs)
            if after is not None:
                quietly(after)
            return result

        wrapper.__flightdeck__ = True
        setattr(module, name, wrapper)
        # `torch.distributed` copied the names before this patch when it was imported first.
        package = sys.modules.get("torch.distributed")
        if package is not None and getattr(package, name, None) is original:
            setattr(package, name, wrapper)

    complaints = []

    def quietly(fn):
        try:
            fn()
        except Exception:
            if not complaints:
                complaints.append(True)
                sys.stderr.write("flightdeck shim: dump failed (training on):\n" + traceback.format_exc())

    def c10d(module):
        hooked(module, "init_process_group", None, start)
        hooked(module, "destroy_process_group", last_dump, None)

    return {"torch.distributed.distributed_c10d": c10d}


def _flightdeck_writers():
    """Reports the program's own metric writers' calls to the agent, as `Logged` JSON lines.

    Wrapped when their module is imported: `SummaryWriter.add_scalar`/`add_scalars`
    (torch.utils.tensorboard, tensorboardX), `transformers.Trainer.log` (TRL's trainers call it)
    and wandb's `Run.log` (what `wandb.log` calls). A call made inside another wrapped call (the
    Trainer's TensorBoard and wandb callbacks) is the same numbers again and is not reported.
    The original always runs first and its result is returned; a report that fails is dropped.
    """
    path = os.environ.get("FLIGHTDECK_TELEMETRY")
    if not path or os.environ.get("FLIGHTDECK_SHIM_WRITERS", "1") == "0":
        return {}
    import json
    import math
    import socket
    import threading

    lock = threading.Lock()
    local = threading.local()
    conn = {"pid": None, "sock": None, "complained": False}
    protocol = 12  # src/protocol/message.rs PROTOCOL_VERSION

    def send(obj):
        with lock:
            if conn["pid"] != os.getpid():
                # First call, or a forked child holding its parent's socket: a connection of its own.
                conn["pid"], conn["sock"] = os.getpid(), None
                try:
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    sock.connect(path)
                    rank = int(os.environ.get("RANK", "0"))
                    hello = {"protocol_version": protocol, "node": os.environ.get("FLIGHTDECK_NODE", "local"),
                             "agent_version": "shim", "role": "rank"}
                    sock.sendall((json.dumps(hello) + "\n" + json.dumps({"Register": {"rank": rank, "pid": os.getpid()}}) + "\n").encode())
                    conn["sock"] = sock
                except (OSError, ValueError):
                    pass
            if conn["sock"] is None:
                return
            try:
                conn["sock"].sendall((json.dumps(obj) + "\n").encode())
            except OSError:
                conn["sock"] = None  # the agent is gone; the program goes on

    def number(v):
        if isinstance(v, (bool, str, bytes)) or v is None:
            return None
        try:
            f = float(v)  # ints, floats, numpy scalars, one-element tensors
        except Exception:
            return None
        return f if math.isfinite(f) else ("nan" if f != f else ("inf" if f > 0 else "-inf"))

    def flat(d, prefix=""):
        out = []
        for k, v in d.items():
            if isinstance(v, dict):
                out.extend(flat(v, prefix + str(k) + "/"))
            else:
                n = number(v)
                if n is not None:
                    out.append([prefix + str(k), n])
        return out

    def step_of(v):
        n = number(v)
        return int(n) if isinstance(n, float) and n >= 0 else None

    def report(writer, step, metrics):
        if metrics:
            send({"Logged": {"writer": writer, "step": step, "metrics": metrics}})

    def wrap(cls, name, writer, pick):
        original = getattr(cls, name, None)
        if original is None or getattr(original, "__flightdeck__", False):
            return

        def wrapper(self, *args, **kwargs):
            if getattr(local, "inside", False):
                return original(self, *args, **kwargs)
            local.inside = True
            try:
                result = original(self, *args, **kwargs)
            finally:
                local.inside = False
            try:
                report(writer, *pick(self, *args, **kwargs))
            except Exception:
                if not conn["complained"]:
                    conn["complained"] = True
                    sys.stderr.write("flightdeck shim: could not report a %s call (training on)\n" % writer)
            return result

        wrapper.__flightdeck__ = True
        wrapper.__wrapped__ = original
        wrapper.__name__ = getattr(original, "__name__", name)
        wrapper.__doc__ = getattr(original, "__doc__", None)
        setattr(cls, name, wrapper)

    def scalar(self, tag, scalar_value, global_step=None, *args, **kwargs):
        n = number(scalar_value)
        return step_of(global_step), ([[str(tag), n]] if n is not None else [])

    def scalars(self, main_tag, tag_scalar_dict, global_step=None, *args, **kwargs):
        return step_of(global_step), flat(tag_scalar_dict, str(main_tag) + "/")

    def trainer(self, logs, *args, **kwargs):
        # After the original ran: it added the epoch (and the tokens seen) to `logs`.
        return step_of(getattr(getattr(self, "state", None), "global_step", None)), flat(logs)

    def wandb_log(self, data, step=None, *args, **kwargs):
        return step_of(step), flat(data) if isinstance(data, dict) else []

    def tensorboard(module):
        wrap(module.SummaryWriter, "add_scalar", "tensorboard", scalar)
        wrap(module.SummaryWriter, "add_scalars", "tensorboard", scalars)

    def hf_trainer(module):
        wrap(module.Trainer, "log", "hf_trainer", trainer)
        # Announced now, long before the first `Trainer.log`: the agent then drops this rank's
        # printed copies of the dicts from the first one on. A report sent only after the first
        # call races the printed line it copies (stdout and this socket are separate streams).
        send({"Logged": {"writer": "hf_trainer", "metrics": []}})

    patches = {
        "torch.utils.tensorboard.writer": tensorboard,
        "tensorboardX.writer": tensorboard,
        "transformers.trainer": hf_trainer,
        "wandb.sdk.wandb_run": lambda m: wrap(m.Run, "log", "wandb", wandb_log),
    }

    def quiet(name, patch):
        def patched(module):
            try:
                patch(module)
            except Exception as e:
                sys.stderr.write("flightdeck shim: %s not wrapped (%r); its metrics come from its printed lines\n" % (name, e))

        return patched

    return {name: quiet(name, patch) for name, patch in patches.items()}


def _flightdeck_finder(patches):
    """Patches each module of `patches` ({name: patch(module)}) right after it has run, before
    its importer sees it; one found already is patched now."""
    if not patches:
        return
    import importlib.util

    class Finder:
        """Finds a patched module with the other finders, and patches it once it has run."""

        busy = set()

        def find_spec(self, name, path=None, target=None):
            if name not in patches or name in self.busy:
                return None
            self.busy.add(name)
            try:
                spec = importlib.util.find_spec(name)
            except Exception:
                return None
            finally:
                self.busy.discard(name)
            loader = getattr(spec, "loader", None)
            run = getattr(loader, "exec_module", None)
            if run is None:
                return spec

            def exec_module(module):
                run(module)
                patches[name](module)

            loader.exec_module = exec_module
            return spec

    for name in patches:
        if name in sys.modules:
            patches[name](sys.modules[name])
    sys.meta_path.insert(0, Finder())


def _die_with_parent():
    """PR_SET_PDEATHSIG(SIGKILL), through libc; nothing where there is no prctl."""
    if os.environ.get("FLIGHTDECK_LAUNCHER") != "torchrun" or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_PDEATHSIG = 1
    libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def _chain():
    """Imports the sitecustomize that this one shadows, then stays the one registered."""
    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.get("sitecustomize")
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    sys.modules.pop("sitecustomize", None)
    try:
        import importlib

        importlib.import_module("sitecustomize")
    except ImportError as e:
        if e.name != "sitecustomize":
            sys.stderr.write("flightdeck shim: the next sitecustomize failed: %r\n" % (e,))
    except Exception as e:
        sys.stderr.write("flightdeck shim: the next sitecustomize failed: %r\n" % (e,))
    finally:
        sys.path[:] = saved
        if ours is not None:
            sys.modules["sitecustomize"] = ours


try:
    _die_with_parent()
    _flightdeck_finder({**_flightdeck_shim(), **_flightdeck_writers()})
except Exception as _e:
    sys.stderr.write("flightdeck shim: off (%r); the program runs uninstrumented\n" % (_e,))
_chain()
