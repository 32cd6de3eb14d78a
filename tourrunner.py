"""The tour's worker process: the sections run in a child process, so that a crash, a hung kernel or a
broken CUDA context costs one section, not the tour.

The parent (tilelang_tour.main) never imports torch or tilelang and never touches CUDA. It starts a worker
(`python tilelang_tour.py --worker SPEC`, in a process group of its own) that runs the sections one after
another, so imports and the background compile are paid once. The worker sends one JSON line per event
over a pipe of its own; its stdout and stderr are relayed as they arrive. The parent enforces each
section's time limit by killing the worker's process group, records a worker that dies as "crashed" (the
signal or exit code, and the last lines it printed) and starts a fresh worker for the sections that remain.
A section that fails with a CUDA error that leaves the context unusable (illegal address, device-side
assert, ...) makes the worker retire after reporting it. After any of these, the fresh worker first checks
that the GPU still runs a tiny kernel; if it does not, the remaining GPU sections skip with that reason.

Fault injection, to see all this work: TILELANG_TOUR_FAULT=section:kind[,section:kind...] makes a section
fault in the worker right before its run. Kinds: raise (a Python exception), segfault, abort, exit
(os._exit(3)), hang (blocks in a native call with SIGINT masked, as a hung kernel does), gpu-hang (a TileLang
kernel that spins forever), gpu-illegal-address (a TileLang kernel that writes far out of bounds). With
--no-isolate only raise and gpu-illegal-address are accepted: the others would end the tour itself.

Only the standard library is imported here; the GPU faults and the GPU check import torch and tilelang.
"""

from __future__ import annotations

import codecs
import collections
import ctypes
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable

from tourkit import SectionResult, UsageError

STARTUP_LIMIT_S = 300.0  # a worker's start, and the gap between two sections (imports, the tilelang probe)
GPU_CHECK_LIMIT_S = 20.0
KILL_GRACE_S = 2.0  # SIGTERM, then SIGKILL after this long
TAIL_LINES = 20

FAULT_ENV = "TILELANG_TOUR_FAULT"
FAULT_KINDS = ("raise", "segfault", "abort", "exit", "hang", "gpu-hang", "gpu-illegal-address")
FATAL_FAULTS = ("segfault", "abort", "exit", "hang", "gpu-hang")

# Failures after which the CUDA context is unusable: every later CUDA call in the process fails the same way.
STICKY_CUDA_ERRORS = ("illegal memory access", "illegal address", "illegal instruction", "unspecified launch failure",
                      "device-side assert", "misaligned address", "cudaerror", "cuda_error_", "cuda error",
                      "launch timed out", "hardware stack error", "uncorrectable ecc")


# ---------------------------------------------------------------------------------------------------------
# Faults: injected ones, and recognizing a broken CUDA context
# ---------------------------------------------------------------------------------------------------------


def parse_faults(text: str | None, names, *, isolate: bool) -> dict[str, str]:
    """TILELANG_TOUR_FAULT's value as {section: kind}; UsageError (one line) for anything else."""
    faults: dict[str, str] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        section, sep, kind = (part.strip() for part in item.partition(":"))
        if not sep or not section or not kind:
            raise UsageError(f"{FAULT_ENV}: {item.strip()!r} is not section:kind (kinds: {', '.join(FAULT_KINDS)})")
        if section not in names:
            raise UsageError(f"{FAULT_ENV}: unknown section {section!r}; valid sections: {', '.join(names)}")
        if kind not in FAULT_KINDS:
            raise UsageError(f"{FAULT_ENV}: unknown fault {kind!r}; choose one of: {', '.join(FAULT_KINDS)}")
        if not isolate and kind in FATAL_FAULTS:
            raise UsageError(f"{FAULT_ENV}: {section}:{kind} would end the tour itself under --no-isolate "
                             f"(there only raise and gpu-illegal-address are accepted)")
        faults[section] = kind
    return faults


def inject_fault(section: str, kind: str) -> None:
    """Make the running section fault the way `kind` says (see the module docstring)."""
    print(f"    fault injected ({FAULT_ENV}): {section}:{kind}", flush=True)
    sys.stderr.flush()
    if kind == "raise":
        raise RuntimeError(f"fault injected by {FAULT_ENV} ({section}:raise)")
    if kind == "segfault":
        ctypes.string_at(0)  # reads address 0: SIGSEGV
        os.kill(os.getpid(), signal.SIGSEGV)
    elif kind == "abort":
        os.abort()
    elif kind == "exit":
        os._exit(3)
    elif kind == "hang":
        block_natively()
    elif kind == "gpu-hang":
        gpu_spin_forever()
    elif kind == "gpu-illegal-address":
        gpu_write_out_of_bounds()


def block_natively() -> None:
    """Block inside read(2) with SIGINT and SIGALRM masked, as a thread waiting on a hung kernel does:
    neither Ctrl-C nor an alarm can end it, only a kill from outside."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGALRM})
    never_written, keep_open = os.pipe()
    os.read(never_written, 1)
    os.close(keep_open)


def spin_forever_program():
    """A TileLang kernel that waits for a flag nobody sets. The atomic load and add keep the loop from
    being optimized away (a loop without side effects may be assumed to end)."""
    import tilelang.language as T

    @T.prim_func
    def spin_forever(flag: T.Tensor((1,), "int32"), spins: T.Tensor((1,), "int32")):
        with T.Kernel(1, threads=32) as _:
            while T.atomic_load(flag[0], memory_order="relaxed") == 0:
                T.atomic_add(spins[0], 1)

    return spin_forever


# TileLang guards indexing it cannot prove in bounds; the out-of-bounds kernel must switch the guard off.
OUT_OF_BOUNDS_PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}


def out_of_bounds_program():
    """A TileLang kernel that writes at out[offset + thread]: the offset is read at run time, so no
    compiler can reject it, and one far past the end is an illegal address."""
    import tilelang.language as T

    @T.prim_func
    def write_out_of_bounds(offset: T.Tensor((1,), "int64"), out: T.Tensor((128,), "float32")):
        with T.Kernel(1, threads=128) as _:
            tx = T.get_thread_binding()
            out[offset[0] + tx] = 1.0

    return write_out_of_bounds


def gpu_spin_forever() -> None:
    import tilelang
    import torch

    kernel = tilelang.compile(spin_forever_program(), target="cuda")
    flag, spins = torch.zeros(1, dtype=torch.int32, device="cuda"), torch.zeros(1, dtype=torch.int32, device="cuda")
    kernel(flag, spins)
    torch.cuda.synchronize()  # never returns


def gpu_write_out_of_bounds() -> None:
    import tilelang
    import torch

    kernel = tilelang.compile(out_of_bounds_program(), target="cuda", pass_configs=OUT_OF_BOUNDS_PASS_CONFIGS)
    offset = torch.tensor([1 << 40], dtype=torch.int64, device="cuda")  # 4 TiB past the buffer
    out = torch.zeros(128, dtype=torch.float32, device="cuda")
    kernel(offset, out)
    torch.cuda.synchronize()  # raises: an illegal memory access was encountered


def gpu_answers() -> None:
    """The check after a crash or a kill: a tiny kernel must run and give the right answer."""
    import torch

    total = (torch.ones(1024, device="cuda") + 1).sum().item()
    torch.cuda.synchronize()
    if total != 2048:
        raise RuntimeError(f"a tiny kernel gave {total}, not 2048")


def broken_cuda_context(result: SectionResult) -> bool:
    """Whether a failed section's error leaves this process's CUDA context unusable."""
    if result.status != "failed":
        return False
    text = f"{result.error_type or ''} {result.error_message or ''}".lower()
    return any(pattern in text for pattern in STICKY_CUDA_ERRORS)


# ---------------------------------------------------------------------------------------------------------
# The worker's side of the pipe
# ---------------------------------------------------------------------------------------------------------


class Channel:
    """JSON lines to the parent, over the file descriptor it passed to the worker."""

    def __init__(self, fd: int):
        self.fd = fd
        self.lock = threading.Lock()

    def send(self, kind: str, **fields: Any) -> None:
        sys.stdout.flush()  # what the section printed reaches the parent before the record that follows it
        sys.stderr.flush()
        data = memoryview((json.dumps({"type": kind, **fields}, default=str) + "\n").encode())
        with self.lock:
            while data:
                data = data[os.write(self.fd, data):]


def arm_worker_diagnostics() -> None:
    """A worker that crashes prints its Python stack (faulthandler); SIGUSR1, which the parent sends at a
    timeout, prints every thread's stack: where the section hung."""
    import faulthandler

    faulthandler.enable(all_threads=True)
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)


def exit_worker(code: int = 0) -> None:
    """Leave without the interpreter's teardown (torch and CUDA can take long there, or crash)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# ---------------------------------------------------------------------------------------------------------
# The parent's side
# ---------------------------------------------------------------------------------------------------------


class SigintFlag:
    """While active (main thread only), Ctrl-C sets a flag instead of raising KeyboardInterrupt anywhere:
    the supervisor polls it, so a Ctrl-C at any point (a worker starting, the pipe being read, the summary
    being printed) ends the run the same way, and a second one changes nothing."""

    def __init__(self, handler=None):
        self.count = 0
        self.previous = None
        self.handler = handler or self._handler  # another handler: just installed for a while

    @property
    def fired(self) -> bool:
        return self.count > 0

    def _handler(self, signum, frame) -> None:
        self.count += 1

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self.handler)
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            self.previous = None
        return False


def death_text(returncode: int) -> tuple[str, str]:
    """(error_type, message) for a worker that ended with `returncode` (negative: killed by a signal)."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return name, f"the worker process was killed by {name} (signal {-returncode})"
    return f"exit code {returncode}", f"the worker process exited with code {returncode}"


class ForgivingStream:
    """The command line's stdout/stderr: text the terminal cannot encode is replaced, and once the reader is
    gone (`| head`, a closed stdout) output is dropped, so the tour still runs its sections, prints nothing
    more and writes its --json record instead of ending in a traceback."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        if self.stream is None:
            return len(text)
        try:
            self.stream.write(text)
        except UnicodeEncodeError:
            encoding = getattr(self.stream, "encoding", None) or "ascii"
            self.write(text.encode(encoding, "replace").decode(encoding))
        except (OSError, ValueError):  # a broken pipe, a closed file
            self._drop()
        return len(text)

    def flush(self) -> None:
        try:
            if self.stream is not None:
                self.stream.flush()
        except (OSError, ValueError):
            self._drop()

    def _drop(self) -> None:
        try:  # the interpreter's own flush at exit must not meet the broken pipe either
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        self.stream = None

    def __getattr__(self, name):
        return getattr(self.stream, name)


class _Relay:
    """Copies one of the worker's output pipes to our stdout or stderr as it arrives (a notebook cell
    shows it) and keeps the last lines in `tail`."""

    def __init__(self, stream_name: str, tail: collections.deque):
        self.stream_name = stream_name
        self.tail = tail
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.partial = ""

    def feed(self, data: bytes) -> None:
        text = self.decoder.decode(data, final=not data)
        if text:
            stream = getattr(sys, self.stream_name)
            stream.write(text)
            stream.flush()
        self.partial += text
        *lines, self.partial = self.partial.split("\n")
        if not data and self.partial:
            lines, self.partial = lines + [self.partial], ""
        self.tail.extend(line.rsplit("\r", 1)[-1] for line in lines)


class Worker:
    """One worker process: its output relayed, its records decoded, its process group killable."""

    def __init__(self, command: list[str], spec: dict[str, Any]):
        read_fd, write_fd = os.pipe()
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONIOENCODING="utf-8")
        try:
            self.proc = subprocess.Popen(command + [json.dumps({**spec, "fd": write_fd})], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(write_fd,),
                                         start_new_session=True, env=env)
        finally:
            os.close(write_fd)
        self.tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
        self.selector = selectors.DefaultSelector()
        self.records = b""
        for fd, role in ((read_fd, None), (self.proc.stdout.fileno(), _Relay("stdout", self.tail)),
                         (self.proc.stderr.fileno(), _Relay("stderr", self.tail))):
            os.set_blocking(fd, False)
            self.selector.register(fd, selectors.EVENT_READ, role)
        self.record_fd = read_fd

    @property
    def open_fds(self) -> int:
        return len(self.selector.get_map())

    def pump(self, timeout: float, records_first: bool = False) -> list[dict]:
        """Relay what the worker printed and return the records it sent, waiting at most `timeout`."""
        messages = []
        if not self.open_fds:
            time.sleep(timeout)
            return messages
        events = self.selector.select(timeout)
        events.sort(key=lambda event: (event[0].data is None) != records_first)
        for key, _ in events:
            try:
                data = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                self.selector.unregister(key.fd)
                if key.data is None:
                    os.close(key.fd)
            if key.data is not None:
                key.data.feed(data)
                continue
            self.records += data
            *lines, self.records = self.records.split(b"\n")
            messages.extend(json.loads(line) for line in lines if line.strip())
        return messages

    def drain(self, seconds: float) -> list[dict]:
        """What is left in the pipes once the worker is gone (its children may hold them: not for long)."""
        messages, deadline = [], time.monotonic() + seconds
        while self.open_fds and time.monotonic() < deadline:
            messages += self.pump(0.05)
        return messages

    def signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> list[dict]:
        """SIGTERM to the whole process group, SIGKILL after KILL_GRACE_S; never waits long for a process
        the driver holds."""
        self.signal_group(signal.SIGTERM)
        messages, deadline = [], time.monotonic() + KILL_GRACE_S
        while self.proc.poll() is None and time.monotonic() < deadline:
            messages += self.pump(0.05)
        self.signal_group(signal.SIGKILL)
        try:
            self.proc.wait(3.0)
        except subprocess.TimeoutExpired:
            pass
        return messages + self.drain(0.5)

    def close(self) -> None:
        self.signal_group(signal.SIGKILL)  # children left behind by a worker that died (nvcc, the probe)
        for key in list(self.selector.get_map().values()):
            self.selector.unregister(key.fd)
            if key.data is None:
                os.close(key.fd)
        self.selector.close()
        for pipe in (self.proc.stdout, self.proc.stderr):
            pipe.close()
        if self.proc.poll() is None:
            try:
                self.proc.wait(1.0)
            except subprocess.TimeoutExpired:
                pass


class Supervisor:
    """Runs `names` in workers, one after another, and returns the records (see the module docstring).

    on_header(device, arch, known): once, when the first worker knows the device (known=False: it died first).
    on_lost(record, index): a section the worker could not report itself (crashed, timed out, interrupted).
    """

    def __init__(self, command: list[str], names: list[str], options: dict[str, Any], *, faults: dict[str, str],
                 sigint: SigintFlag, on_header: Callable, on_lost: Callable, detect_device: bool):
        self.command, self.names, self.options, self.faults = command, list(names), options, faults
        self.sigint, self.on_header, self.on_lost = sigint, on_header, on_lost
        self.timeout = float(options.get("timeout") or 0)
        self.exitfirst = bool(options.get("exitfirst"))
        self.device: dict | None = None
        self.detect = detect_device
        self.probe = None
        self.header_done = False
        self.check_gpu = False
        self.gpu_broken: str | None = None
        self.results: list[dict] = []
        self.interrupted = False

    def run(self) -> list[dict]:
        pending = list(self.names)
        while pending and not self.sigint.fired:
            outcome = self._one_worker(pending)
            if outcome in ("done", "interrupted"):
                break
            if self.exitfirst and outcome in ("crashed", "timed out"):
                break
        self.interrupted = self.interrupted or self.sigint.fired
        return self.results

    def _header(self, device, arch, known: bool = True) -> None:
        if not self.header_done:
            self.header_done = True
            self.on_header(device, arch, known)

    def _spec(self, pending: list[str]) -> dict[str, Any]:
        return {"names": pending, "first_index": len(self.results) + 1, "total": len(self.names),
                "options": self.options, "faults": self.faults, "device": self.device,
                "detect": self.detect and self.device is None, "probe": self.probe,
                "gpu_check": self.check_gpu and self.gpu_broken is None, "gpu_broken": self.gpu_broken}

    def _lose(self, pending: list[str], status: str, seconds: float, error_type: str | None, message: str | None,
              tail, title: str | None) -> None:
        name = pending.pop(0)
        record = SectionResult(name=name, title=title or name, status=status, seconds=seconds,
                               error_type=error_type, error_message=message,
                               traceback_tail="\n".join(tail) or None).to_dict()
        self._header(None, self.options.get("arch"), known=False)  # the worker died before it said
        self.results.append(record)
        self.on_lost(record, len(self.results))

    def _one_worker(self, pending: list[str]) -> str:
        """Start a worker for `pending` and follow it until it ends; returns why it ended."""
        worker = Worker(self.command, self._spec(pending))
        self.check_gpu = False
        state = {"phase": "startup", "started": time.monotonic(), "title": None, "outcome": None}
        try:
            while True:
                if self.sigint.fired:
                    self._handle(worker.kill(), worker, pending, state)
                    if state["phase"] == "section":
                        self._lose(pending, "interrupted", time.monotonic() - state["started"], None, None,
                                   worker.tail, state["title"])
                        print(f"\n■ interrupted during {self.results[-1]['name']}", flush=True)
                    self.interrupted = True
                    return "interrupted"
                self._handle(worker.pump(0.1, records_first=not self.header_done), worker, pending, state)
                if worker.proc.poll() is not None:
                    break
                phase, started = state["phase"], state["started"]
                limit = {"section": self.timeout, "gpu_check": GPU_CHECK_LIMIT_S}.get(phase, STARTUP_LIMIT_S)
                if limit and time.monotonic() - started > limit:
                    return self._stopped(worker, pending, state, time.monotonic() - started, limit)
            self._handle(worker.drain(1.0), worker, pending, state)  # what it sent just before it exited
            phase, started, outcome = state["phase"], state["started"], state["outcome"]
            if outcome is not None:
                return outcome
            error_type, message = death_text(worker.proc.returncode)
            if not pending:
                return "done"
            if phase == "gpu_check":
                self.gpu_broken = f"the GPU did not answer a tiny kernel after {self._last()}: {message}"
                return "gpu"
            if phase == "probing":  # no section's fault: the next worker skips them with this reason
                self.probe = (False, f"importing tilelang ended the worker process ({error_type})")
                return "probe"
            self._lose(pending, "crashed", time.monotonic() - started if phase == "section" else 0.0, error_type,
                       message + ("" if phase == "section" else " before the section started"), worker.tail,
                       state["title"])
            self.check_gpu = True
            return "crashed"
        finally:
            worker.close()

    def _handle(self, messages: list[dict], worker: Worker, pending: list[str], state: dict) -> None:
        """Act on the worker's records: the phase it is in (state), the sections' results."""
        for message in messages:
            kind = message["type"]
            if kind == "hello":
                self.device = message["device"]
                self.options = {**self.options, "arch": message["arch"]}
                self._header(message["device"], message["arch"])
            elif kind == "probing":
                state.update(phase="probing", started=time.monotonic())
            elif kind == "probe":
                self.probe = message["probe"]
                state.update(phase="startup", started=time.monotonic())
            elif kind == "gpu_check":
                state.update(phase="gpu_check", started=time.monotonic())
            elif kind == "gpu_result":
                state.update(phase="between", started=time.monotonic())
                if not message["ok"]:
                    self.gpu_broken = message["reason"]
                    state["outcome"] = "gpu"
            elif kind == "start":
                state.update(phase="section", started=time.monotonic(), title=None)
            elif kind == "loaded":
                state["title"] = message["title"]
            elif kind == "result":
                state.update(phase="between", started=time.monotonic())
                self.results.append(message["record"])
                pending.pop(0)
                worker.tail.clear()  # what follows belongs to the next section
                if message.get("retire"):
                    state["outcome"], self.check_gpu = "retire", True
            elif kind == "done":
                state["outcome"] = "done"

    def _last(self) -> str:
        last = self.results[-1] if self.results else None
        return f"{last['name']} {last['status']}" if last else "a crash"

    def _stopped(self, worker: Worker, pending, state: dict, seconds: float, limit: float) -> str:
        """The phase ran past its limit: dump the worker's stacks (SIGUSR1), kill it, record why."""
        phase, finished = state["phase"], len(self.results)
        if hasattr(signal, "SIGUSR1"):
            try:
                os.kill(worker.proc.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:
                self._handle(worker.pump(0.05), worker, pending, state)
        self._handle(worker.kill(), worker, pending, state)
        self.check_gpu = True
        if not pending:
            return "done"
        if len(self.results) > finished:  # its result came in at the limit: the next worker takes what is left
            return "retire"
        if phase == "gpu_check":
            self.gpu_broken = f"the GPU did not answer a tiny kernel within {limit:.0f} s after {self._last()}"
            return "gpu"
        if phase == "probing":
            self.probe = (False, f"importing tilelang took more than {limit:.0f} s; the worker process was stopped")
            return "probe"
        if phase == "section":
            message = f"took more than {limit:g} s; the worker process was stopped"
        else:
            message = f"the worker process did not start the section within {limit:.0f} s"
        self._lose(pending, "timed out", seconds, "SectionTimeout", message, worker.tail, state["title"])
        return "timed out"
