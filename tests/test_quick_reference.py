"""The quick reference names only what the pinned tilelang has: T.* names, pass configs, environment variables."""

import re

import tilelang
import tilelang.language as T
from tilelang.transform.pass_config import PassConfigKey, _DEPRECATED_PASS_CONFIG_MESSAGES

import tourkit
from tilelang_tour import QUICK_REFERENCE


def test_pinned_version_is_the_installed_one():
    assert tilelang.__version__ == tourkit.TILELANG_PIN
    assert f"tilelang {tourkit.TILELANG_PIN}" in QUICK_REFERENCE


def test_every_language_name_exists():
    names = set(re.findall(r"\bT\.([A-Za-z_]\w*)", QUICK_REFERENCE))
    assert {"Kernel", "alloc_shared", "alloc_fragment", "alloc_local", "copy", "gemm", "Pipelined", "Parallel",
            "reduce_max", "reduce_sum", "use_swizzle", "print"} <= names
    missing = sorted(n for n in names if not hasattr(T, n))
    assert not missing, f"not in tilelang.language {tilelang.__version__}: {missing}"
    assert hasattr(T.GemmWarpPolicy, "FullRow")


def test_every_tilelang_attribute_exists():
    names = set(re.findall(r"\btilelang\.([A-Za-z_]\w*)", QUICK_REFERENCE))
    assert {"compile", "autotune", "jit"} <= names
    for name in names:
        assert hasattr(tilelang, name), name


def test_pass_configs_exist_and_are_not_deprecated():
    keys = set(re.findall(r'"(tl\.[a-z_]+)"', QUICK_REFERENCE))
    assert keys, "the reference shows at least one pass config"
    known = {k.value for k in PassConfigKey}
    for key in keys:
        assert key in known, key
        assert key not in _DEPRECATED_PASS_CONFIG_MESSAGES, key


def test_environment_variables_exist():
    from tilelang.env import Environment

    variables = set(re.findall(r"\b(TILELANG_[A-Z_]+|TL_[A-Z_]+)=", QUICK_REFERENCE))
    assert {"TILELANG_CACHE_DIR", "TILELANG_DISABLE_CACHE"} <= variables
    for var in variables:
        assert hasattr(Environment, var), var
