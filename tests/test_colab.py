"""The tour for notebooks (tools/make_colab.py): tilelang_tour_colab.py pasted alone into a cell of a real
Jupyter kernel, the next cells calling main(), a crashing section that costs one section and not the kernel,
the notebook run top to bottom, and the committed files up to date with the sources.

No GPU is used: the kernels run with CUDA_VISIBLE_DEVICES empty, so the GPU sections skip (a GPU machine
would otherwise run the whole tour here), and compile-only runs build for sm_80."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tourkit

ROOT = Path(__file__).resolve().parent.parent
COLAB = ROOT / "tilelang_tour_colab.py"
NOTEBOOK = ROOT / "tilelang_tour.ipynb"
MAKE = ROOT / "tools" / "make_colab.py"
NO_GPU = "no CUDA GPU found"
COMPILE_VECTOR_ADD = '["--only", "vector_add", "--compile-only", "--arch", "sm_80"]'


def load_make_colab():
    spec = importlib.util.spec_from_file_location("make_colab", MAKE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def jupyter():
    """nbformat and nbclient, or a skip that says what to install."""
    for name in ("nbformat", "nbclient", "ipykernel"):
        pytest.importorskip(name, reason="the notebook tests need: pip install nbclient ipykernel")
    import nbclient
    import nbformat

    return nbformat, nbclient


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    """The environment of the test kernels: no GPU, no fault or section override from the tests around,
    not the repository on the path, and a cache folder of their own (where the tour's files are written)."""
    cache = tmp_path_factory.mktemp("cache")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TILELANG_TOUR_") and k != "PYTHONPATH"}
    env.update(XDG_CACHE_HOME=str(cache), CUDA_VISIBLE_DEVICES="")
    return env


def execute(nb, env, cwd, timeout=240):
    """Run every cell in a fresh kernel started in `cwd`; a cell that raises fails the test (nbclient)."""
    _, nbclient = jupyter()
    nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}}).execute(env=env)
    return nb


def stream_text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o["output_type"] == "stream")


def result(cell):
    """What the cell printed after RESULT, as JSON."""
    lines = [line for line in stream_text(cell).splitlines() if line.startswith("RESULT ")]
    assert lines, stream_text(cell)[-2000:]
    return json.loads(lines[-1][len("RESULT "):])


def assert_no_traceback(nb):
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            assert output["output_type"] != "error", (index, output)
            text = output.get("text", "") + json.dumps(output.get("data", {}))
            assert "Traceback (most recent call last)" not in text, (index, text[-2000:])
            assert "SystemExit" not in text, (index, text[-2000:])


# ---------------------------------------------------------------------------------------------------------
# The single file, pasted into a cell
# ---------------------------------------------------------------------------------------------------------

RECORDS = "[[r.name, r.status, r.skip_reason] for r in {}.results]"


@pytest.fixture(scope="module")
def pasted(tmp_path_factory, kernel_env):
    """One kernel, in an empty folder but for the file: the file's text as the first cell, then the cells a
    user would write next."""
    nbformat, _ = jupyter()
    folder = tmp_path_factory.mktemp("pasted")
    shutil.copy(COLAB, folder)
    cells = [
        COLAB.read_text(encoding="utf-8"),
        "import json, os, tilelang_tour\n"
        f"print('RESULT', json.dumps({{'pid': os.getpid(), 'file': tilelang_tour.__file__, "
        f"'exit': tour_run.exit_code, 'records': {RECORDS.format('tour_run')}}}))",
        f"run = main({COMPILE_VECTOR_ADD})\n"
        f"print('RESULT', json.dumps({{'exit': run.exit_code, 'records': {RECORDS.format('run')}}}))",
        "os.environ['TILELANG_TOUR_FAULT'] = 'env_check:segfault'\n"
        "run = main(['--only', 'env_check,vector_add', '--compile-only', '--arch', 'sm_80'])\n"
        "del os.environ['TILELANG_TOUR_FAULT']\n"
        f"print('RESULT', json.dumps({{'exit': run.exit_code, 'records': {RECORDS.format('run')}}}))",
        "os.environ['TILELANG_TOUR_FAULT'] = 'vector_add:segfault'\n"
        f"run = main({COMPILE_VECTOR_ADD})\n"
        "del os.environ['TILELANG_TOUR_FAULT']\n"
        f"print('RESULT', json.dumps({{'exit': run.exit_code, 'records': {RECORDS.format('run')}}}))",
        "print('RESULT', json.dumps({'pid': os.getpid()}))",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    return execute(nb, kernel_env, folder), kernel_env


def test_pasted_file_runs_the_tour(pasted):
    nb, env = pasted
    first = result(nb.cells[1])
    assert first["file"].startswith(env["XDG_CACHE_HOME"] + os.sep), first["file"]  # not the repository's
    records = {name: (status, reason) for name, status, reason in first["records"]}
    assert records["env_check"][0] in ("passed", "skipped"), records
    for name, (status, reason) in records.items():
        if name != "env_check":
            assert status == "skipped" and NO_GPU in reason, (name, status, reason)
    assert first["exit"] == 0
    assert "Summary" in stream_text(nb.cells[0]) and "TileLang quick reference" in stream_text(nb.cells[0])


def test_next_cell_runs_one_section(pasted):
    nb, _ = pasted
    assert result(nb.cells[2]) == {"exit": 0, "records": [["vector_add", "passed", None]]}
    assert "■ [1/1] vector_add passed" in stream_text(nb.cells[2])


def test_a_crash_costs_one_section_not_the_kernel(pasted):
    nb, _ = pasted
    crashed = result(nb.cells[3])
    assert crashed["exit"] == 1
    assert [r[:2] for r in crashed["records"]] == [["env_check", "crashed"], ["vector_add", "passed"]]
    assert "SIGSEGV" in stream_text(nb.cells[3])
    alone = result(nb.cells[4])
    assert alone["exit"] == 1 and [r[:2] for r in alone["records"]] == [["vector_add", "crashed"]]
    assert result(nb.cells[5])["pid"] == result(nb.cells[1])["pid"]  # the same kernel, still answering


def test_no_traceback_reaches_a_cell(pasted):
    assert_no_traceback(pasted[0])


def test_as_a_script(tmp_path, kernel_env):
    shutil.copy(COLAB, tmp_path)
    listed = subprocess.run([sys.executable, COLAB.name, "--list"], cwd=tmp_path, env=kernel_env,
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split()[:2] == ["env_check", "vector_add"]
    refused = subprocess.run([sys.executable, COLAB.name, "--only", "nope"], cwd=tmp_path, env=kernel_env,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "unknown section 'nope'" in refused.stderr


# ---------------------------------------------------------------------------------------------------------
# The notebook
# ---------------------------------------------------------------------------------------------------------


def test_notebook_runs_top_to_bottom(tmp_path, kernel_env):
    nbformat, _ = jupyter()
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    runs = [c for c in nb.cells if c.get("id", "").endswith("-run")]
    names = [c["id"].removeprefix("sections-").removesuffix("-run") for c in runs]
    assert all(f'main(["--only", "{name}"])' in c.source for name, c in zip(names, runs))
    assert names[:2] == ["env_check", "vector_add"] and len(names) == len(set(names)) >= 8
    # The lesson cells write the lessons back: the files must be exactly the tour's own.
    nb.cells.append(nbformat.v4.new_code_cell(
        "import json, os\n"
        "print('RESULT', json.dumps([p for p, t in _TOUR_FILES.items() "
        "if open(os.path.join(TOUR_DIR, p), encoding='utf-8').read() != t]))"))
    execute(nb, kernel_env, tmp_path)
    assert_no_traceback(nb)
    assert result(nb.cells[-1]) == []
    for name, cell in zip(names, runs):
        text = stream_text(cell)
        if name == "env_check":
            assert "■ [1/1] env_check passed" in text or "■ [1/1] env_check skipped" in text, text[-2000:]
        else:
            assert f"■ [1/1] {name} skipped" in text and NO_GPU in text, text[-2000:]


# ---------------------------------------------------------------------------------------------------------
# The generator
# ---------------------------------------------------------------------------------------------------------


def test_committed_files_are_up_to_date():
    done = subprocess.run([sys.executable, str(MAKE), "--check"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_check_sees_a_changed_source(tmp_path):
    for path in [*ROOT.glob("*.py"), *ROOT.glob("*.ipynb")]:
        shutil.copy(path, tmp_path)
    shutil.copytree(ROOT / "sections", tmp_path / "sections", ignore=shutil.ignore_patterns("__pycache__"))
    check = [sys.executable, str(MAKE), "--check", "--root", str(tmp_path)]
    subprocess.run([sys.executable, str(MAKE), "--root", str(tmp_path)], check=True, capture_output=True)
    assert subprocess.run(check, capture_output=True).returncode == 0
    with open(tmp_path / "tourkit.py", "a") as fh:
        fh.write("# changed\n")
    stale = subprocess.run(check, capture_output=True, text=True)
    assert stale.returncode == 1
    assert "tilelang_tour_colab.py and tilelang_tour.ipynb out of date" in stale.stderr


def test_files_that_raw_strings_cannot_hold_still_round_trip():
    make_colab = load_make_colab()
    for text in ["x = '''a'''\n", "no newline at the end", "ends in a quote '\n", "back\\slash\\\n", "cr\r\n"]:
        namespace = {}
        exec(make_colab.bootstrap_code() + f"\n_tour_file('a.py', {make_colab.string_literal(text)})\n", namespace)
        assert namespace["_TOUR_FILES"] == {"a.py": text}


@pytest.mark.parametrize("colab", [True, False])
def test_a_missing_tilelang(colab, tmp_path, kernel_env):
    """In Colab the setup installs a missing tilelang with env_check's installer (a fake one here); elsewhere
    it says how. The file is imported as a module: it sets the tour up and defines main without running it."""
    code = f"""
import importlib.util, sys, types
if {colab}:
    sys.modules["google.colab"] = types.ModuleType("google.colab")
found = importlib.util.find_spec
importlib.util.find_spec = lambda name, *args: None if name == "tilelang" else found(name, *args)
tour = {{"__name__": "pasted_module"}}
exec(open({str(COLAB)!r}, encoding="utf-8").read(), tour)
from sections import env_check
env_check.install_tilelang = lambda ctx: ctx.log("fake install") or True
tour["_tour_ensure_tilelang"]()
print("main" in tour, "tour_run" in tour)
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=kernel_env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "True False"
    if colab:
        assert lines[:-1] == ["tilelang is not installed; installing it (Colab)", "fake install"]
    else:
        assert lines[:-1] == [f"tilelang is not installed: {tourkit.TILELANG_INSTALL} (or main(['--install']) "
                              f"lets env_check install it)"]


def test_a_file_git_does_not_track_is_left_out(tmp_path):
    """A scratch file in sections/ would be missing from a fresh clone, where --check would then fail."""
    for path in ROOT.glob("*.py"):
        shutil.copy(path, tmp_path)
    shutil.copytree(ROOT / "sections", tmp_path / "sections", ignore=shutil.ignore_patterns("__pycache__"))
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "sources"], check=True)
    (tmp_path / "sections" / "scratch.py").write_text("SCRATCH = 1\n")
    done = subprocess.run([sys.executable, str(MAKE), "--root", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "left out sections/scratch.py: git does not track it" in done.stderr
    assert "SCRATCH" not in (tmp_path / "tilelang_tour_colab.py").read_text(encoding="utf-8")
