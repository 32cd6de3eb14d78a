"""The problems a user may hand one section with `--shape` (and `--dtype`), checked before anything compiles.

Pure Python: the runner checks a shape in its own process, which never imports torch or tilelang, so a
malformed or unsupported problem is refused in one line (exit code 2) before a worker starts.

    vector_add        N
    gemm_schedules    MxNxK        (also fusion, autotune)
    softmax           MxN          (rows x width)
    flash_attention   BxHxSxD      (batch, heads, sequence length, head dim; causal and full)
                      BxHxSxDxKVH  (grouped-query attention: KVH key/value heads shared by H query heads)
"""

from __future__ import annotations

FORMS = {
    "vector_add": ("N",),
    "gemm_schedules": ("MxNxK",),
    "fusion": ("MxNxK",),
    "autotune": ("MxNxK",),
    "softmax": ("MxN",),
    "flash_attention": ("BxHxSxD", "BxHxSxDxKVH"),
}
DTYPES = ("float16", "bfloat16")
DTYPE_SECTIONS = ("gemm_schedules", "fusion", "autotune", "softmax", "flash_attention")
ATTENTION_HEAD_DIMS = (64, 128, 256)  # the head dims flash_attention has kernels for
SOFTMAX_MAX_WIDTH = 262144  # the widest row softmax plans for (a vocabulary is 32K to 256K)
MAX_GRID_YZ = 65535  # blocks a CUDA grid takes along y and z
MAX_ELEMENTS = 1 << 34  # a sanity bound per tensor (16 Gi elements): beyond any GPU the tour runs on


class ShapeError(ValueError):
    """A --shape/--dtype the section cannot take; the message is the one line the user sees."""


def parse_dims(text: str) -> tuple[int, ...]:
    parts = text.lower().replace("×", "x").split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise ShapeError(f"--shape {text!r}: give positive integers joined by 'x', such as 4096x4096x1024") from None
    if any(d < 1 for d in dims):
        raise ShapeError(f"--shape {text!r}: every size must be at least 1")
    return dims


def check_attention(dims: tuple[int, ...]) -> None:
    batch, heads, seq_len, dim = dims[:4]
    if dim not in ATTENTION_HEAD_DIMS:
        raise ShapeError(f"flash_attention has kernels for head dims {', '.join(map(str, ATTENTION_HEAD_DIMS))}, "
                         f"not D={dim}")
    if max(batch, heads) > MAX_GRID_YZ:
        raise ShapeError(f"flash_attention launches its grid as (query tiles, heads, batch): H and B may be at most "
                         f"{MAX_GRID_YZ:,} (CUDA's limit), not B={batch:,}, H={heads:,}")
    if len(dims) == 5:
        kv_heads = dims[4]
        if heads % kv_heads:
            raise ShapeError(f"grouped-query attention needs H={heads} to be a multiple of KVH={kv_heads}")


def check_elements(section: str, dims: tuple[int, ...]) -> None:
    """Refuse tensors no GPU holds (a typo such as 100000x100000x100000)."""
    if section == "flash_attention":
        tensors = [dims[0] * dims[1] * dims[2] * dims[3]]
    elif len(dims) == 3:
        M, N, K = dims
        tensors = [M * K, K * N, M * N]
    else:
        tensors = [1]
        for d in dims:
            tensors[0] *= d
    if max(tensors) > MAX_ELEMENTS:
        raise ShapeError(f"--shape {'x'.join(map(str, dims))}: a tensor of {max(tensors):,} elements is beyond "
                         f"any GPU here (at most {MAX_ELEMENTS:,})")


def parse_shape(section: str, text: str) -> tuple[int, ...]:
    """The dims of `text` for `section`, or ShapeError saying what the section accepts."""
    forms = FORMS.get(section)
    if forms is None:
        accepted = ", ".join(FORMS)
        raise ShapeError(f"--shape does not apply to {section} (it runs fixed problems); it applies to {accepted}")
    dims = parse_dims(text)
    arities = {len(form.split("x")) for form in forms}
    if len(dims) not in arities:
        raise ShapeError(f"--shape {text!r}: {section} takes {' or '.join(forms)}")
    if section == "softmax" and dims[1] > SOFTMAX_MAX_WIDTH:
        raise ShapeError(f"softmax plans rows of up to {SOFTMAX_MAX_WIDTH:,} columns, not N={dims[1]:,}")
    if section == "flash_attention":
        check_attention(dims)
    check_elements(section, dims)
    return dims


def check_dtype(sections: list[str], dtype: str) -> None:
    if dtype not in DTYPES:
        raise ShapeError(f"--dtype {dtype!r}: give one of {', '.join(DTYPES)}")
    if dtype != "float16" and not any(s in DTYPE_SECTIONS for s in sections):
        raise ShapeError(f"--dtype applies to {', '.join(DTYPE_SECTIONS)}; none of them is selected")


def check_request(sections: list[str], only_given: bool, text: str | None, dtype: str) -> tuple[int, ...] | None:
    """The run's --shape (None when not given) and --dtype for the sections selected: the parsed dims, or
    ShapeError. A shape is one section's problem: it needs exactly one, chosen with --only."""
    check_dtype(sections, dtype)
    if text is None:
        return None
    if not only_given or len(sections) != 1:
        raise ShapeError("--shape needs exactly one section, chosen with --only "
                         "(e.g. --only softmax --shape 8192x32000)")
    return parse_shape(sections[0], text)


def describe(section: str) -> str:
    return " or ".join(FORMS.get(section, ()))
