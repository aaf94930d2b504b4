"""Every code block in docs/*.md is executed (or at least compiled) by these tests.

The convention, for anyone writing docs:

- ```python blocks run. All of them in one docs file are concatenated, in order, into one script that runs in
  a fresh subprocess (cwd: a temp dir, ``FRAY_JOBS_DIR``: a temp dir, ``FRAY_CLUSTER_SPEC`` unset), with a
  timeout. Assert what you claim (``assert info.status == JobStatus.SUCCEEDED``), so the docs stay true.
- ```python file=NAME blocks are written to NAME in that temp dir before anything runs (and compiled when
  NAME ends in .py), for shell commands such as ``fray launch train:main`` or ``python -m pytest test_x.py``.
- ```python before-ray blocks (the Ray "before" of a migration) and ```python norun blocks are only compiled.
- ```python ray blocks need the Ray backend: they run only under the pytest marker ``ray``, concatenated per
  file in a subprocess with ``FRAY_CLUSTER_SPEC=ray?address=<the session's emulated cluster>&jobs_dir=<tmp>``.
- ```bash and ```console blocks: the command lines (in console blocks, the lines starting with ``$ ``) that
  start with ``fray ``, ``python ``, ``NAME=$(fray ...)``/``NAME=$(python ...)``, ``FRAY_X=... fray ...`` or
  ``export FRAY_X=...`` run, in order, in one ``bash`` script per file (``set -e``: every command must exit 0;
  so ``ID=$(fray launch ...)`` carries into ``fray status $ID``), after that file's python blocks, in the same
  temp dir, with ``fray`` and ``python`` on PATH. Other lines (``pip install``, ``python -m pip``, ``cd``) are
  shown, not run. A ```bash norun / ```console norun block is not run at all (commands with placeholders).
- ```text blocks are output; blocks with no language (diagrams) or any other language are skipped.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import os
import pkgutil
import re
import shlex
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
DOC_FILES = sorted(p.name for p in DOCS.glob("*.md"))
TIMEOUT = 600  # per file and kind of run

_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*(.*)$")
_RUNNABLE = re.compile(
    r"^(export FRAY_\w+=\S+$"
    r"|([A-Z_][A-Z0-9_]*=\S+\s+)*(fray|python)\s"
    r"|[A-Za-z_]\w*=\$\((fray|python)\s)"
)
_NOT_RUN = re.compile(r"^(python -m pip|pip)\b")


@attrs.frozen
class Block:
    lang: str
    flags: tuple[str, ...]
    code: str
    line: int  # 1-based line of the opening fence

    def flag(self, name: str) -> str | None:
        for f in self.flags:
            key, eq, value = f.partition("=")
            if key == name:
                return value if eq else ""
        return None


def parse_blocks(text: str) -> list[Block]:
    """Fenced blocks of a markdown text: language, flags (``file=x.py``, ``ray``, ...), code."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.group(1), m.group(2), m.group(3).strip()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(fence) and lines[i].strip().strip(fence[0]) == ""):
            line = lines[i]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            i += 1
        i += 1
        words = info.split()
        blocks.append(
            Block(
                lang=(words[0].lower() if words else ""),
                flags=tuple(words[1:]),
                code="\n".join(body) + "\n",
                line=start + 1,
            )
        )
    return blocks


def shell_commands(block: Block) -> list[str]:
    """The runnable command lines of a bash/console block (continuations joined)."""
    raw = block.code.splitlines()
    if block.lang == "console":
        cmds, current = [], None
        for line in raw:
            if line.startswith("$ "):
                current = line[2:]
                cmds.append(current)
            elif current is not None and cmds and cmds[-1].endswith("\\"):
                cmds[-1] = cmds[-1][:-1] + " " + line.strip()
            else:
                current = None
        lines = cmds
    else:
        lines = []
        for line in raw:
            if lines and lines[-1].endswith("\\"):
                lines[-1] = lines[-1][:-1] + " " + line.strip()
            else:
                lines.append(line.strip())
    return [c for c in lines if c and not c.startswith("#") and _RUNNABLE.match(c) and not _NOT_RUN.match(c)]


def _blocks(name: str) -> list[Block]:
    return parse_blocks((DOCS / name).read_text())


def _is_python(b: Block) -> bool:
    return b.lang in ("python", "py", "python3")


def _runs(b: Block) -> bool:
    return _is_python(b) and not ({"before-ray", "norun", "ray"} & set(b.flags)) and b.flag("file") is None


def _is_shell(b: Block) -> bool:
    return b.lang in ("bash", "sh", "shell", "console") and "norun" not in b.flags


def _script(name: str, blocks: list[Block]) -> str:
    parts = [f"# ---- docs/{name} line {b.line}\n{b.code}" for b in blocks]
    return "\n".join(parts)


def _bin_dir(tmp: Path) -> Path:
    """``python`` (this interpreter, in its environment) and ``fray`` first on PATH, as a user's shell has them.

    ``python`` is a script that execs ``sys.executable`` by its own path, not a symlink to it: Python finds
    its venv from the path it was started by (``pyvenv.cfg`` next to or above it), so a venv's python
    symlinked into another directory starts as the base interpreter, without the venv's packages (Fray
    itself and its pytest plugin). The venv's ``fray`` script names its interpreter in its shebang.
    """
    bin_dir = tmp / ".bin"
    bin_dir.mkdir(exist_ok=True)
    _exec_script(bin_dir / "python", [sys.executable])
    fray = Path(sys.executable).with_name("fray")
    if fray.exists():
        (bin_dir / "fray").symlink_to(fray)
    else:
        _exec_script(bin_dir / "fray", [sys.executable, "-m", "fray_core.cli"])
    return bin_dir


def _exec_script(path: Path, argv: list[str]) -> None:
    path.write_text("#!/bin/sh\nexec " + " ".join(shlex.quote(a) for a in argv) + ' "$@"\n')
    path.chmod(0o755)


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    # the compat run_on_pod follows $RAY_ADDRESS, as levanter did: not the developer's cluster
    env = {k: v for k, v in os.environ.items() if k not in ("FRAY_CLUSTER_SPEC", "RAY_ADDRESS")}
    env["FRAY_JOBS_DIR"] = str(tmp / "jobs")
    env["PATH"] = f"{_bin_dir(tmp)}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def _write_files(tmp: Path, blocks: list[Block]) -> None:
    for b in blocks:
        name = b.flag("file")
        if name:
            path = tmp / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(b.code)


def _run(cmd: list[str], tmp: Path, env: dict[str, str], what: str) -> None:
    try:
        r = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{what}: timed out after {TIMEOUT}s\nstdout:\n{e.stdout}\nstderr:\n{e.stderr}")
    if r.returncode != 0:
        pytest.fail(f"{what}: exit code {r.returncode}\nstdout:\n{r.stdout[-6000:]}\nstderr:\n{r.stderr[-6000:]}")


def _files_with(pred) -> list[str]:  # type: ignore[no-untyped-def]
    return [n for n in DOC_FILES if any(pred(b) for b in _blocks(n))]


# ------------------------------------------------------------------------------------------------ tests


def test_docs_exist() -> None:
    for name in ("index.md", "concepts.md", "backends.md", "testing.md", "troubleshooting.md"):
        assert name in DOC_FILES, f"docs/{name} is missing"


@pytest.mark.parametrize("name", DOC_FILES)
def test_doc_python_blocks_compile(name: str) -> None:
    """Every python block compiles, including the ones that are not run."""
    for b in _blocks(name):
        fname = b.flag("file")
        if _is_python(b) and (fname is None or fname.endswith(".py")):
            compile(b.code, f"docs/{name}:{b.line}", "exec")


@pytest.mark.parametrize("name", _files_with(lambda b: _runs(b) or (_is_shell(b) and shell_commands(b))))
def test_doc_runs(name: str, tmp_path: Path) -> None:
    """The file's python blocks in one subprocess, then its shell command lines in one bash script."""
    blocks = _blocks(name)
    _write_files(tmp_path, blocks)
    env = _env(tmp_path)
    python = [b for b in blocks if _runs(b)]
    if python:
        script = tmp_path / f"doc_{Path(name).stem}.py"
        script.write_text(_script(name, python))
        _run([sys.executable, str(script)], tmp_path, env, f"python blocks of docs/{name}")
    commands = [c for b in blocks if _is_shell(b) for c in shell_commands(b)]
    if commands:
        script = tmp_path / f"doc_{Path(name).stem}.sh"
        script.write_text("set -eo pipefail\nset -x\n" + "\n".join(commands) + "\n")
        _run(["bash", str(script)], tmp_path, env, f"shell commands of docs/{name}")


@pytest.mark.ray
@pytest.mark.parametrize("name", _files_with(lambda b: _is_python(b) and "ray" in b.flags))
def test_doc_ray_blocks(name: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """```python ray blocks, against the session's emulated Ray TPU cluster."""
    fake = request.getfixturevalue("ray_tpu_cluster")
    blocks = [b for b in _blocks(name) if _is_python(b) and "ray" in b.flags]
    _write_files(tmp_path, _blocks(name))
    script = tmp_path / f"doc_{Path(name).stem}_ray.py"
    script.write_text(_script(name, blocks))
    env = _env(tmp_path, FRAY_CLUSTER_SPEC=f"ray?address={fake.address}&jobs_dir={tmp_path / 'ray-jobs'}")
    _run([sys.executable, str(script)], tmp_path, env, f"ray blocks of docs/{name}")


def test_doc_shell_python_is_this_environment(tmp_path: Path) -> None:
    """``python`` in the docs' shell commands is this interpreter in its environment: run from a venv, it is
    that venv (its site-packages, Fray installed there, Fray's pytest plugin), as for a user who activated it."""
    r = subprocess.run(
        ["bash", "-c", "python -c 'import sys; print(sys.prefix); print(sys.executable)'"],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    prefix, executable = r.stdout.splitlines()
    assert (prefix, executable) == (sys.prefix, sys.executable)


def test_parser_follows_the_convention() -> None:
    text = (
        "```python\nx = 1\n```\n"
        "```python file=train.py\ndef main(): pass\n```\n"
        "```console\n$ fray list\nID  NAME\n$ pip install fray\n$ ID=$(fray launch a:b)\n```\n"
        "```bash\nfray status $ID \\\n  --json\npython -m pip install -e .\ncd /x\n```\n"
        "```\ndiagram\n```\n"
    )
    blocks = parse_blocks(text)
    assert [b.lang for b in blocks] == ["python", "python", "console", "bash", ""]
    assert [_runs(b) for b in blocks] == [True, False, False, False, False]
    assert blocks[1].flag("file") == "train.py"
    assert shell_commands(blocks[2]) == ["fray list", "ID=$(fray launch a:b)"]
    assert shell_commands(blocks[3]) == ["fray status $ID  --json"]


def test_readme_usage_runs(tmp_path: Path) -> None:
    """README.md's usage example runs as written (its set-up commands are what CI runs)."""
    blocks = [b for b in parse_blocks((DOCS.parent / "README.md").read_text()) if _runs(b)]
    assert blocks, "README.md has no python usage block"
    script = tmp_path / "readme_usage.py"
    script.write_text(_script("../README.md", blocks))
    _run([sys.executable, str(script)], tmp_path, _env(tmp_path), "README.md's usage example")


def test_readme_demo_command_runs(tmp_path: Path) -> None:
    """README.md's demo (``python examples/multislice_demo.py``): a preempted attempt, then success."""
    demo = DOCS.parent / "examples" / "multislice_demo.py"
    assert f"python {demo.relative_to(DOCS.parent)}" in (DOCS.parent / "README.md").read_text()
    r = subprocess.run(
        [sys.executable, str(demo)],
        cwd=DOCS.parent,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "SUCCEEDED, preemptions=1, failures=0" in r.stdout, r.stdout[-3000:]
    rows = [line for line in r.stdout.splitlines() if line[:1].isdigit()]  # the attempts table
    assert [row.split()[0] for row in rows] == ["0", "1"] and "PREEMPTED" in rows[0] and "SUCCEEDED" in rows[1], rows


def test_readme_says_how_to_install_the_distribution() -> None:
    """README names the distribution pyproject.toml builds (not ``fray``: that name on PyPI is another project)."""
    pyproject = (DOCS.parent / "pyproject.toml").read_text()
    m = re.search(r'^\[project\]\n(?:.*\n)*?name = "([^"]+)"', pyproject, re.M)
    assert m, "pyproject.toml has no [project].name"
    name = m.group(1)
    assert name != "fray"
    readme = (DOCS.parent / "README.md").read_text()
    assert f"distribution is called `{name}`" in readme
    assert "python -m pip install -e ." in readme


def test_ci_runs_readme_test_command() -> None:
    """``.ci/run`` runs README.md's test command word for word: the command ``.ci/readme_test_command.py``
    reads is README's one bash block that runs pytest, and ``.ci/run`` runs what it prints in a fresh venv."""
    root = DOCS.parent
    spec = importlib.util.spec_from_file_location("readme_test_command", root / ".ci" / "readme_test_command.py")
    assert spec and spec.loader
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)
    readme = (root / "README.md").read_text()
    blocks = [b for b in parse_blocks(readme) if b.lang == "bash" and "pytest" in b.code]
    assert len(blocks) == 1, blocks
    assert helper.test_command(readme) == blocks[0].code.strip()
    ci = (root / ".ci" / "run").read_text()
    for step in (
        "cmd=$(python3 .ci/readme_test_command.py)",
        'rm -rf "$venv"',
        'python3 -m venv "$venv"',
        '. "$venv/bin/activate"',
        'bash -c "$cmd"',
        'exit "$status"',
    ):
        assert step in ci, step
    with pytest.raises(ValueError, match="found 2"):
        helper.test_command("```bash\npython -m pytest a\n```\n\n```bash\npytest b\n```\n")
    with pytest.raises(ValueError, match="one line"):
        helper.test_command("```bash\npip install -e .\npython -m pytest\n```\n")


MODULES = sorted(
    m.name
    for pkg in ("fray_core", "fray_local", *(("fray_ray",) if importlib.util.find_spec("ray") else ()))
    for m in pkgutil.walk_packages([str(REPO / pkg)], pkg + ".")
    if not m.name.endswith("__main__")
)


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples(module: str) -> None:
    """Every example in a docstring of fray_core, fray_local and (with ray installed) fray_ray runs and prints
    what it shows."""
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} docstring example(s) of {module} failed (output above)"


def _alone(name: str, pick=lambda b: True) -> list[tuple[str, int]]:  # type: ignore[no-untyped-def]
    return [(name, b.line) for b in _blocks(name) if _runs(b) and pick(b)]


@pytest.mark.parametrize(
    ("name", "line"),
    _alone("index.md")
    + _alone("backends.md", lambda b: "TpuFleet({" in b.code and "LocalCluster(fleet=fleet)" in b.code),
)
def test_doc_block_runs_alone(name: str, line: int, tmp_path: Path) -> None:
    """A reader copies one snippet, not the page: each python block of docs/index.md (and backends.md's fleet
    block) runs on its own, with its own imports."""
    blocks = _blocks(name)
    _write_files(tmp_path, blocks)
    block = next(b for b in blocks if b.line == line)
    script = tmp_path / "alone.py"
    script.write_text(_script(name, [block]))
    _run([sys.executable, str(script)], tmp_path, _env(tmp_path), f"docs/{name} line {line} alone")


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n#", start + len(heading))
    return text[start : end if end != -1 else len(text)]


def test_ray_job_and_sky_jobs_table_names_real_commands() -> None:
    """docs/index.md's table for users of ``ray job`` and ``sky jobs``: a row for each of their everyday
    commands, and every ``fray`` command and option it names is one the parser has."""
    from fray_core.cli import build_parser

    parser = build_parser()
    commands = parser.parse_args(["list"])._subparsers
    table = _section((DOCS / "index.md").read_text(), "## Coming from `ray job` or `sky jobs`")
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines() if line.startswith("| ")]
    ray_column = " ".join(r[1] for r in rows[1:])
    for everyday in ("submit", "list", "status", "logs", "stop", "delete", "--address"):
        assert everyday in ray_column, f"no row for `ray job {everyday}`"
    checked = 0
    for row in rows[1:]:
        for snippet in re.findall(r"`(fray [^`]+)`", row[3]):
            words = snippet.replace("\\|", "|").split()
            command = words[1]
            assert command in commands, f"`{snippet}`: no command {command!r}"
            options = {o for a in commands[command]._actions for o in a.option_strings}
            options |= {o for a in parser._actions for o in a.option_strings}
            for word in words[2:]:
                flag = word.strip("[]").split("=")[0]
                if flag.startswith("-") and flag != "--":
                    assert flag in options, f"`{snippet}`: fray {command} has no option {flag}"
            checked += 1
        for flag in re.findall(r"`(--[a-z-]+)", row[3]):
            assert any(flag in {o for a in p._actions for o in a.option_strings} for p in commands.values()), flag
    assert checked >= 10, checked  # the table was read


def test_configuration_lists_every_environment_variable() -> None:
    """docs/configuration.md is the one page with every ``FRAY_*`` variable Fray reads or sets (``FRAY_SIM_*``
    style globs cover families); a new one in the code must be added there."""
    import fnmatch

    page = (DOCS / "configuration.md").read_text()
    listed = set(re.findall(r"`(FRAY_[A-Z0-9_*]+)`", page))
    used: set[str] = set()
    for pkg in ("fray_core", "fray_local", "fray_ray"):
        for path in (REPO / pkg).rglob("*.py"):
            if path.name == "conformance.py":
                continue  # the conformance kit's own marker variables for test jobs
            used |= set(re.findall(r"[\"'](FRAY_[A-Z0-9_]+)[\"']", path.read_text()))
    missing = sorted(v for v in used if not any(fnmatch.fnmatchcase(v, pattern) for pattern in listed))
    assert not missing, f"docs/configuration.md does not list {missing}"


def test_index_names_every_dependency() -> None:
    """docs/index.md says what installing Fray brings: every ``[project].dependencies`` entry of pyproject.toml."""
    pyproject = (REPO / "pyproject.toml").read_text()
    block = re.search(r"^dependencies = \[\n(.*?)^\]", pyproject, re.M | re.S)
    assert block
    names = re.findall(r'^\s*"([A-Za-z0-9_.-]+)', block.group(1), re.M)
    assert names
    paragraph = _section((DOCS / "index.md").read_text(), "## 1. Install")
    assert not [n for n in names if f"`{n}`" not in paragraph], (names, paragraph)


def _shape(line: str) -> str:
    """A line of fray's output with what changes from run to run (ids, numbers, bar lengths) taken out."""
    line = re.sub(r"\b[a-z0-9-]+-\d{8}-\d{6}-[0-9a-f]{6}\b", "ID", line)
    line = re.sub(r"\|[0-9=~x?>.P -]+\|", "|BAR|", line)
    line = re.sub(r"\d+(\.\d+)?", "N", line)
    return " ".join(line.split()) if line.strip() else ""


def test_launch_wait_sample_output_is_what_prints(tmp_path: Path) -> None:
    """docs/index.md's sample of ``fray launch --wait train:main steps=3`` has every kind of line the command
    prints (launched, state, the job's lines, the attempt, the timeline and its legend, goodput, result) and
    no other: it lacked the timeline, goodput and result lines once."""
    blocks = _blocks("index.md")
    _write_files(tmp_path, blocks)
    command = "fray launch --wait train:main steps=3"
    at = next(i for i, b in enumerate(blocks) if _is_shell(b) and shell_commands(b) == [command])
    sample = next(b for b in blocks[at + 1 :] if b.lang == "text").code
    r = subprocess.run(
        [sys.executable, "-m", "fray_core.cli", *command.split()[1:]],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr

    def shapes(text: str) -> set[str]:
        # how long the attempt waited for its process is timing: on a loaded machine (CI) the bar starts with
        # a wait, drawn as dots, and the legend names them ("attempt N starts = succeeded . waiting for slices")
        lines = {_shape(x).replace(" . waiting for slices", "") for x in text.splitlines()} - {""}
        axis = {x for x in lines if re.fullmatch(r"(Ns ?)+", x.replace("N.Ns", "Ns"))}
        return (lines - axis) | ({"AXIS"} if axis else set())

    progress = re.compile(r"^\[fray\] ID: (RUNNING|PENDING) \|")  # one line per change: how many is timing
    want, got = shapes(sample), shapes(r.stdout)
    assert {x for x in want if not progress.match(x)} == {x for x in got if not progress.match(x)}, (want, got)
    assert any(progress.match(x) for x in want) and any(progress.match(x) for x in got)
