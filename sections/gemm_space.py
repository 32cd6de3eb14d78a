"""The autotune lesson's search space: a product of values per knob (the config dicts tilelang.autotune takes),
filtered by what a thread can keep in registers and what a block's shared memory holds."""

import itertools

from sections.gemm_plans import GemmConfig, fits

TUNED_KEYS = ("block_M", "block_N", "block_K", "num_stages", "threads", "swizzle")
SPACES: dict[str, dict[str, dict[str, list]]] = {
    # Hopper: two consumer warpgroups (256 threads; TileLang adds a producer warpgroup), as one alone cannot hold
    # a 128x256 fp32 accumulator in registers. 256x256 tiles are left out (MAX_ACCUMULATORS).
    "hopper": {"default": {"block_M": [128, 256], "block_N": [128, 256], "block_K": [64], "num_stages": [3, 4],
                           "threads": [256], "swizzle": [True, False]},
               "full": {"block_M": [64, 128, 256], "block_N": [128, 256], "block_K": [32, 64],
                        "num_stages": [2, 3, 4], "threads": [128, 256], "swizzle": [True, False]}},
    "ampere": {"default": {"block_M": [128, 256], "block_N": [128, 256], "block_K": [32], "num_stages": [3, 4],
                           "threads": [256], "swizzle": [True, False]},
               "full": {"block_M": [64, 128, 256], "block_N": [64, 128, 256], "block_K": [32, 64],
                        "num_stages": [2, 3, 4], "threads": [128, 256], "swizzle": [True, False]}},
    "turing": {"default": {"block_M": [64, 128], "block_N": [64, 128], "block_K": [32], "num_stages": [2],
                           "threads": [128, 256], "swizzle": [True, False]},
               "full": {"block_M": [64, 128, 256], "block_N": [64, 128, 256], "block_K": [32, 64],
                        "num_stages": [1, 2, 3], "threads": [128, 256], "swizzle": [True, False]}},
}
SPACES["ada"] = SPACES["ampere"]


# A thread keeps its share of the fp32 accumulator in registers for the whole K loop; beyond 128 values ptxas
# spills (256x256 tiles over 256 threads spilled on sm_80 and sm_90a; 128x256 ones fit in 168-211 registers).
# On Hopper `threads` are the consumers: the producer warpgroup TileLang adds holds no accumulator. Turing has
# no cp.async, so its A and B tiles also pass through registers on their way to shared memory: there the two
# together stay within 160 (128x128x32 over 128 threads: 128 + 32; 64x256x32 tiles, 128 + 40, spilled).
MAX_ACCUMULATORS = 128
MAX_WITH_COPIES = 160  # Turing


def accumulators(config: dict) -> int:
    """fp32 accumulator values one (consumer) thread holds: block_M x block_N over the threads."""
    return config["block_M"] * config["block_N"] // config["threads"]


def copy_registers(config: dict) -> int:
    """Registers a thread's share of one A tile and one B tile takes (2-byte elements, two a register)."""
    return (config["block_M"] + config["block_N"]) * config["block_K"] // config["threads"] // 2


def stays_in_registers(config: dict, family: str) -> bool:
    """Whether ptxas can keep a thread's accumulator (on Turing, and its copies) in registers."""
    if family == "turing":
        return accumulators(config) + copy_registers(config) <= MAX_WITH_COPIES
    return accumulators(config) <= MAX_ACCUMULATORS


def search_space(family: str, full: bool = False) -> list[dict]:
    """Every combination of the family's values (the config dicts tilelang.autotune takes) whose accumulator
    stays in registers."""
    if family not in SPACES:
        raise ValueError(f"no autotune space for architecture family {family!r}")
    axes = SPACES[family]["full" if full else "default"]
    product = (dict(zip(TUNED_KEYS, values)) for values in itertools.product(*(axes[k] for k in TUNED_KEYS)))
    return [c for c in product if stays_in_registers(c, family)]


def to_gemm_config(config: dict) -> GemmConfig:
    return GemmConfig(*(config[k] for k in TUNED_KEYS))


def filter_space(configs: list[dict], smem_budget: int) -> tuple[list[dict], list[tuple[dict, int]]]:
    """Split the space into what fits one block's shared memory and what does not (with the bytes it needs)."""
    kept = [c for c in configs if fits(to_gemm_config(c), smem_budget)]
    return kept, [(c, to_gemm_config(c).smem_bytes()) for c in configs if c not in kept]


def describe(c: dict) -> str:
    """A schedule in words: '128x256x64 tile, 3 stages, 256 threads, swizzled'."""
    return (f"{c['block_M']}x{c['block_N']}x{c['block_K']} tile, {c['num_stages']} stages, {c['threads']} threads, "
            f"{'swizzled' if c['swizzle'] else 'not swizzled'}")
