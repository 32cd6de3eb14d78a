"""The tour's sections, one module each, in the order the tour runs them.

Each module defines `SECTION`, a `tourkit.Section`. The runner imports them one at a time, so a section
whose module cannot be imported fails (or skips) alone.
"""

SECTION_NAMES = [
    "env_check",
    "vector_add",
    "gemm_schedules",
    "fusion",
    "softmax",
    "flash_attention",
    "autotune",
    "debugging",
]
