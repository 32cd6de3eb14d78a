"""env_check: what you are about to run on.

What you learn: which versions of Python, PyTorch, TileLang and its TVM FFI layer are installed; what the
GPU offers a kernel (compute capability, SM count, memory, the shared memory one block may opt into);
which driver and CUDA versions sit underneath; whether nvcc and a host C++ compiler are there. TileLang
is imported in a child process first, because a broken install can abort the importing process; when it
is missing or cannot be imported, this section fails with the fix (the other sections skip).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import platform
import shutil
import subprocess
import sys

import tourkit
from tourkit import Section


def package_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def in_colab() -> bool:
    return "google.colab" in sys.modules


def tool_version(command: list[str], line: int = -1) -> str | None:
    """One non-empty line (the last by default) of a tool's output, or None if the tool is missing."""
    if shutil.which(command[0]) is None and not command[0].startswith("/"):
        return None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [ln.strip() for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    return lines[line] if lines else None


def cuda_driver_api_version() -> str | None:
    """The CUDA version the driver supports, read from libcuda itself (no torch needed)."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int()
        if libcuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
            return None
        return f"{version.value // 1000}.{(version.value % 1000) // 10}"
    except OSError:
        return None


def nvidia_driver_version() -> str | None:
    out = tool_version(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return out.split(",")[0].strip() if out else None


def install_tilelang(ctx) -> bool:
    """pip-install the pinned tilelang, falling back to the nightly wheels. Returns True on success."""
    for command in (tourkit.TILELANG_INSTALL, tourkit.TILELANG_NIGHTLY_INSTALL):
        ctx.log(f"running: {sys.executable} -m {command}")
        done = subprocess.run([sys.executable, "-m", *command.split()], capture_output=True, text=True)
        if done.returncode == 0:
            ok, detail = tourkit.probe_tilelang_import()
            ctx.log(f"installed tilelang {detail}" if ok else f"installed, but the import still fails: {detail}")
            if ok:
                return True
        else:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
            ctx.log(f"  failed: {tail[0]}")
    return False


def check_tilelang(ctx) -> tuple[bool, str]:
    ok, detail = tourkit.probe_tilelang_import()
    if ok or "not installed" not in detail:
        return ok, detail
    if in_colab() or getattr(ctx, "install", False):
        ctx.log("tilelang is not installed; installing it" + (" (Colab)" if in_colab() else " (--install)"))
        if install_tilelang(ctx):
            return tourkit.probe_tilelang_import()
        return False, "installing tilelang failed"
    ctx.log(f"tilelang is not installed. Install it with:  {tourkit.TILELANG_INSTALL}")
    ctx.log(f"   (or the nightly wheels:  {tourkit.TILELANG_NIGHTLY_INSTALL};  or rerun with --install)")
    return False, detail


class TileLangUnavailable(RuntimeError):
    """tilelang is missing or cannot be imported; the message says how to fix it."""


def tilelang_fix(detail: str) -> str:
    if "not installed" in detail or "installing tilelang failed" in detail:
        return f"install it: {tourkit.TILELANG_INSTALL} (or rerun with --install)"
    return (f"reinstall it ({tourkit.TILELANG_INSTALL}); if it cannot write its cache, set TILELANG_CACHE_DIR "
            f"(and TMPDIR) to a writable directory")


def software_rows(tilelang_detail: str, tilelang_ok: bool) -> list[list[str]]:
    try:
        import torch

        torch_text = f"{torch.__version__} (CUDA build {torch.version.cuda or 'none: CPU-only'})"
    except ImportError:
        torch_text = "not installed (pip install torch)"
    nvcc = tourkit.find_nvcc()
    nvcc_text = f"{nvcc}: {tool_version([nvcc, '--version'])}" if nvcc else "not found (compile-only mode can only lower)"
    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    return [
        ["python", f"{platform.python_version()} ({sys.executable})"],
        ["torch", torch_text],
        ["tilelang", tilelang_detail if tilelang_ok else f"unavailable: {tilelang_detail}"],
        ["apache-tvm-ffi", package_version("apache-tvm-ffi") or "not installed"],
        ["nvcc", nvcc_text],
        ["host C++ compiler", f"{cxx}: {tool_version([cxx, '--version'], line=0)}" if cxx else "not found"],
        ["Colab", "yes" if in_colab() else "no"],
    ]


def target_note(device) -> str:
    if not tourkit.runs_kernels(device):
        return "older than the sm_75 the tour's kernels need"
    if device.capability >= (10, 0):  # Blackwell: tcgen05, not wgmma
        return f"TileLang target {device.arch}; the lessons' Ampere-style kernels, mma.sync fed by TMA"
    return f"TileLang target {device.arch}"


def gpu_rows(device) -> list[list[str]]:
    return [
        ["GPU", device.name],
        ["compute capability", f"{device.capability[0]}.{device.capability[1]} ({target_note(device)})"],
        ["SMs", str(device.sm_count)],
        ["memory", tourkit.format_bytes(device.memory_bytes)],
        ["shared memory / block (opt-in max)", f"{device.smem_per_block_optin} B ({tourkit.format_bytes(device.smem_per_block_optin)})"],
        ["L2 cache", tourkit.format_bytes(device.l2_bytes)],
        ["driver", nvidia_driver_version() or "unknown (no nvidia-smi)"],
        ["CUDA (driver API)", cuda_driver_api_version() or "unknown"],
    ]


def run(ctx) -> None:
    tilelang_ok, tilelang_detail = check_tilelang(ctx)
    ctx.table(["software", "found"], software_rows(tilelang_detail, tilelang_ok))
    ctx.metric(python=platform.python_version(), tilelang=tilelang_detail if tilelang_ok else None,
               apache_tvm_ffi=package_version("apache-tvm-ffi"), nvcc=tourkit.find_nvcc(), colab=in_colab())

    device = ctx.device if ctx.device is not None else tourkit.detect_device()
    if device is None:
        ctx.log("")
        ctx.log("No CUDA GPU visible to torch. The GPU sections will skip; with --compile-only they still")
        ctx.log(f"build every kernel for an architecture you name (--arch, default {tourkit.DEFAULT_ARCH}).")
        ctx.headline(gpu="none", tilelang=tilelang_detail if tilelang_ok else "missing")
    else:
        ctx.log("")
        ctx.table(["device", "value"], gpu_rows(device))
        if not tourkit.runs_kernels(device):
            ctx.log("The tour's kernels need sm_75 (Turing) or newer: the GPU sections will skip; with")
            ctx.log(f"--compile-only they still build every kernel (--arch, default {tourkit.DEFAULT_ARCH}).")
        ctx.metric(gpu=device.name, capability=f"{device.capability[0]}.{device.capability[1]}",
                   sm_count=device.sm_count, memory_bytes=device.memory_bytes,
                   smem_per_block_optin=device.smem_per_block_optin, l2_bytes=device.l2_bytes,
                   driver=nvidia_driver_version(), cuda_driver_api=cuda_driver_api_version())
        real_arch = device.arch if tourkit.runs_kernels(device) else "sm_%d%d" % device.capability
        ctx.headline(gpu=device.name, arch=real_arch, tilelang=tilelang_detail if tilelang_ok else "missing")
    if not tilelang_ok:
        raise TileLangUnavailable(f"tilelang unavailable: {tilelang_detail}; {tilelang_fix(tilelang_detail)}")


SECTION = Section(
    name="env_check",
    title="Environment check",
    summary="Versions, the GPU and what one block may use, compilers; tilelang imported safely first.",
    run=run,
    needs_gpu=False,
)
