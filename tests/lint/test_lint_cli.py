"""The CLI: proven red on the real config, config failure modes, modes, formats, exit codes."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
from collections.abc import Callable

import pytest

from .lint_support import REPO, CliResult, Project, real_lint_table, real_lint_table_text
from nursery_jobs_lint.config import Config, compile_glob

Run = Callable[..., CliResult]
MakeProject = Callable[[str], Project]

SPAWN_LINE = "nursery.start_soon(f)\n"


def example_path_for(glob: str, key: str, include: list[str], config: Config) -> str:
    """A file path that ``glob`` matches and that lies under ``include`` (for planting)."""
    segments = []
    for segment in glob.strip("/").split("/"):
        if segment == "**":
            continue
        segment = re.sub(r"\[!?([^\]])[^\]]*\]", r"\1", segment).replace("*", "planted").replace("?", "x")
        segments.append(segment)
    derived = "/".join(segments)
    if not derived.endswith(".py"):
        derived = f"{derived}/planted_example.py" if derived else "planted_example.py"
    for candidate in [derived, *(f"{entry.rstrip('/')}/{derived}" for entry in include if entry not in (".", "./"))]:
        if glob in config.matches(key, candidate) and config.matches("include", candidate):
            return candidate
    raise AssertionError(f"cannot plant a file for {key} entry {glob!r}; extend example_path_for")


def planted_real_project(make_project: MakeProject) -> tuple[Project, dict[str, object]]:
    """A temp git project with the repository's actual table and a file for every allow/tests glob."""
    table = real_lint_table()
    project = make_project(real_lint_table_text())
    config = Config(root=project.root, include=tuple(table["include"]), allow=tuple(table["allow"]), tests=tuple(table["tests"]))  # type: ignore[arg-type]
    for key in ("allow", "tests"):
        for glob in table[key]:  # type: ignore[attr-defined]
            project.write(example_path_for(glob, key, table["include"], config), "VALUE = 1\n")  # type: ignore[arg-type]
    return project, table


# -- proven red (§1.9 item 3) -----------------------------------------------------------


def test_proven_red_on_the_real_config(run_cli: Run, make_project: MakeProject) -> None:
    project, table = planted_real_project(make_project)
    allowed = ", ".join(table["allow"])  # type: ignore[arg-type]

    clean = run_cli(cwd=project.root)
    assert clean.code == 0, clean
    assert clean.out == ""

    project.write("nursery_jobs/jobs_planted.py", SPAWN_LINE)
    red = run_cli(cwd=project.root)
    assert red.code == 1, red
    assert red.out == (
        "nursery_jobs/jobs_planted.py:1:1: NJS102 spawn via '.start_soon' outside infra; "
        f"ask nursery_jobs.infra.owner for a scope (allowed: {allowed})\n"
    )
    assert re.fullmatch(r"nursery-jobs-lint: 1 violation in 1 file \(\d+ files checked\)\n", red.err), red.err

    project.remove("nursery_jobs/jobs_planted.py")
    project.write("nursery_jobs/infra/jobs_planted.py", SPAWN_LINE)
    in_infra = run_cli(cwd=project.root)
    assert in_infra.code == 0, in_infra
    assert in_infra.out == ""

    project.write("nursery_jobs/jobs_planted.py", "nursery.start_soon(f)  # noqa: NJS102\n")
    suppressed = run_cli(cwd=project.root)
    assert suppressed.code == 1, suppressed
    lines = suppressed.out.splitlines()
    assert [line.split(" ")[1] for line in lines] == ["NJS102", "NJS002"]
    assert lines[1].startswith("nursery_jobs/jobs_planted.py:1:24: NJS002 suppression comment '# noqa: NJS102'")


def test_planted_violation_in_file_mode_like_pre_commit(run_cli: Run, make_project: MakeProject) -> None:
    project, _ = planted_real_project(make_project)
    project.write("nursery_jobs/jobs_planted.py", SPAWN_LINE)
    project.write("nursery_jobs/infra/jobs_planted.py", SPAWN_LINE)
    project.write("tests/test_planted.py", SPAWN_LINE)
    project.write("scripts/outside_include.py", SPAWN_LINE)
    result = run_cli(
        "nursery_jobs/jobs_planted.py",
        "nursery_jobs/infra/jobs_planted.py",
        "tests/test_planted.py",
        "scripts/outside_include.py",
        cwd=project.root,
    )
    assert result.code == 1, result
    assert [line.split(":")[0] for line in result.out.splitlines()] == ["nursery_jobs/jobs_planted.py"]
    assert "(2 files checked)" in result.err


# -- config failure modes (§1.9 item 4) -------------------------------------------------


def _simple_project(make_project: MakeProject, table: str) -> Project:
    project = make_project(table)
    project.write("pkg/__init__.py", "")
    project.write("pkg/infra/owner.py", SPAWN_LINE)
    project.write("tests/test_x.py", SPAWN_LINE)
    return project


GOOD_TABLE = '[tool.nursery_jobs.lint]\ninclude = ["pkg", "tests"]\nallow = ["pkg/infra/**"]\ntests = ["tests/**"]\n'


def test_simple_project_is_clean(run_cli: Run, make_project: MakeProject) -> None:
    result = run_cli(cwd=_simple_project(make_project, GOOD_TABLE).root)
    assert (result.code, result.out) == (0, ""), result
    assert result.err == "nursery-jobs-lint: no violations (2 files checked)\n"


@pytest.mark.parametrize(
    "table,message",
    [
        (GOOD_TABLE + 'alow = ["pkg/infra/**"]\n', "unknown key in [tool.nursery_jobs.lint]: 'alow' (did you mean 'allow'?)"),
        (GOOD_TABLE.replace('"pkg/infra/**"', '"pkg/infra/**", "pkg/gone/**"'), "allow entry 'pkg/gone/**' matches no Python file"),
        (GOOD_TABLE.replace('tests = ["tests/**"]', 'tests = ["tests/**", "**/conftest.py"]'), "tests entry '**/conftest.py'"),
        (GOOD_TABLE.replace('include = ["pkg", "tests"]', "include = []"), "include is empty"),
        (GOOD_TABLE.replace('include = ["pkg", "tests"]', 'include = ["docs"]'), "nothing to check"),
        (GOOD_TABLE.replace('"pkg/infra/**"', '"pkg/[infra/**"'), "is not a valid glob: unbalanced '['"),
        (GOOD_TABLE + 'nursery-name-regex = "(unclosed"\n', "is not a valid regular expression"),
        (GOOD_TABLE + 'extend-select = ["NJS102"]\n', "'NJS102' is always on"),
        (GOOD_TABLE + 'extend-select = ["NJS999"]\n', "'NJS999' is not a rule code"),
        (GOOD_TABLE + "allow = 3\n", "not valid TOML"),
        (GOOD_TABLE.replace('allow = ["pkg/infra/**"]', 'allow = "pkg/infra/**"'), "allow must be a list of strings"),
        (GOOD_TABLE + 'roots = ["src"]\n', "roots entry 'src' is not a directory"),
        (GOOD_TABLE + "extend-banned-names = { twisted = 1 }\n", "extend-banned-names must be a table"),
    ],
    ids=[
        "unknown-key",
        "stale-allow",
        "stale-tests",
        "empty-include",
        "zero-files",
        "bad-glob",
        "bad-regex",
        "select-always-on",
        "select-unknown",
        "bad-toml",
        "wrong-type",
        "missing-root",
        "bad-banned-names",
    ],
)
def test_config_failures_exit_2(run_cli: Run, make_project: MakeProject, table: str, message: str) -> None:
    result = run_cli(cwd=_simple_project(make_project, table).root)
    assert result.code == 2, result
    assert result.out == ""
    assert result.err.startswith("nursery-jobs-lint: error: ")
    assert message in result.err


def test_stale_check_is_full_mode_only(run_cli: Run, make_project: MakeProject) -> None:
    table = GOOD_TABLE.replace('"pkg/infra/**"', '"pkg/infra/**", "pkg/gone/**"')
    project = _simple_project(make_project, table)
    project.write("pkg/job.py", "x = 1\n")
    assert run_cli("pkg/job.py", cwd=project.root).code == 0


def test_not_a_git_repository_is_no_verdict(run_cli: Run, tmp_path: pathlib.Path) -> None:
    (tmp_path / "pyproject.toml").write_text(GOOD_TABLE)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("x = 1\n")
    result = run_cli(cwd=tmp_path)
    assert result.code == 2 and "git work tree" in result.err, result
    # file mode does not need git
    assert run_cli("pkg/m.py", cwd=tmp_path).code == 0


def test_missing_path_and_missing_config_are_no_verdict(run_cli: Run, make_project: MakeProject) -> None:
    project = _simple_project(make_project, GOOD_TABLE)
    assert run_cli("pkg/nope.py", cwd=project.root).code == 2
    assert run_cli("--config", "nope.toml", cwd=project.root).code == 2


def test_usage_error_is_exit_2(run_cli: Run, make_project: MakeProject) -> None:
    project = _simple_project(make_project, GOOD_TABLE)
    with pytest.raises(SystemExit) as exc:
        run_cli("--output-format", "xml", cwd=project.root)
    assert exc.value.code == 2


def test_config_flag_and_untracked_files(run_cli: Run, make_project: MakeProject) -> None:
    project = _simple_project(make_project, GOOD_TABLE)
    project.write("pkg/new_untracked.py", SPAWN_LINE)  # never git-added: still judged in full mode
    project.write(".gitignore", "pkg/ignored.py\n")
    project.write("pkg/ignored.py", SPAWN_LINE)
    sub = project.root / "pkg"
    result = run_cli("--config", str(project.root / "pyproject.toml"), cwd=sub)
    assert result.code == 1
    assert result.out.startswith("pkg/new_untracked.py:1:1: NJS102 ")
    assert "ignored" not in result.out


def test_internal_error_is_exit_2_with_traceback(
    run_cli: Run, make_project: MakeProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nursery_jobs_lint.cli as cli

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(cli, "check_source", boom)
    result = run_cli(cwd=_simple_project(make_project, GOOD_TABLE).root)
    assert result.code == 2
    assert "Traceback" in result.err and "RuntimeError: boom" in result.err


# -- output formats ---------------------------------------------------------------------


def test_output_formats(run_cli: Run, make_project: MakeProject) -> None:
    project = _simple_project(make_project, GOOD_TABLE)
    project.write("pkg/job.py", 'x = "é"; nursery.start_soon(f)\nimport threading\n')
    text = run_cli(cwd=project.root)
    assert text.out.splitlines()[0].startswith("pkg/job.py:1:10: NJS102 spawn via '.start_soon'")
    assert text.out.splitlines()[1].startswith("pkg/job.py:2:8: NJS201 import of banned concurrency module 'threading'")

    as_json = json.loads(run_cli("--output-format", "json", cwd=project.root).out)
    assert [(d["path"], d["line"], d["column"], d["code"], d["name"]) for d in as_json] == [
        ("pkg/job.py", 1, 10, "NJS102", "spawn-method"),
        ("pkg/job.py", 2, 8, "NJS201", "banned-module-import"),
    ]

    github = run_cli("--output-format", "github", cwd=project.root).out.splitlines()
    assert github[0].startswith("::error file=pkg/job.py,line=1,col=10,title=NJS102 spawn-method::spawn via")
    assert "%2C" not in github[0].split("::")[2]  # only properties escape commas


def test_show_config(run_cli: Run, make_project: MakeProject) -> None:
    project = _simple_project(make_project, GOOD_TABLE)
    result = run_cli("--show-config", cwd=project.root)
    assert result.code == 0
    assert 'allow = ["pkg/infra/**"]' in result.out
    assert 'nursery-name-regex = "(?i)(^|_)(nursery|task_?group|tg)$"' in result.out


# -- re-export following (§1.5 item 6) --------------------------------------------------

REEXPORT_TABLE = '[tool.nursery_jobs.lint]\ninclude = ["pkg"]\nallow = ["pkg/infra/**"]\n'


def test_first_party_reexports_are_followed_in_full_mode(run_cli: Run, make_project: MakeProject) -> None:
    project = make_project(REEXPORT_TABLE)
    project.write("pkg/__init__.py", "")
    project.write("pkg/infra/__init__.py", "from .x import Thread as Thread\n")
    project.write(
        "pkg/infra/x.py",
        "from threading import Thread\nimport trio\nll = trio.lowlevel\n\ndef run_blocking(fn):\n    return fn()\n",
    )
    project.write("pkg/infra/hop2.py", "from pkg.infra.x import ll\n")
    project.write("pkg/infra/hop3.py", "from .hop2 import ll\n")
    project.write(
        "pkg/job.py",
        "from pkg.infra.x import Thread, run_blocking\n"
        "from .infra import Thread as T2\n"
        "from pkg.infra.hop3 import ll\n"
        "Thread(target=f).start()\n"
        "ll.spawn_system_task(f)\n"
        "run_blocking(f)\n",
    )
    full = run_cli(cwd=project.root)
    assert full.code == 1, full
    got = [line.split(": ")[0] + " " + line.split(": ")[1].split(" ")[0] for line in full.out.splitlines()]
    assert got == [
        "pkg/job.py:1:25 NJS201",
        "pkg/job.py:2:20 NJS201",
        "pkg/job.py:4:1 NJS202",
        "pkg/job.py:5:1 NJS103",
    ]
    assert "through a first-party re-export" in full.out.splitlines()[0]
    # file mode does not follow re-exports (pre-commit stays local and fast); CI's full run does
    assert run_cli("pkg/job.py", cwd=project.root).code == 0


def test_reexport_depth_is_bounded(run_cli: Run, make_project: MakeProject) -> None:
    project = make_project(REEXPORT_TABLE)
    project.write("pkg/infra/a.py", "from threading import Thread\n")
    for index, name in enumerate("bcde"):
        project.write(f"pkg/infra/{name}.py", f"from .{'abcde'[index]} import Thread\n")
    project.write("pkg/job3.py", "from pkg.infra.c import Thread\n")  # c -> b -> a -> threading: 3 hops
    project.write("pkg/job5.py", "from pkg.infra.e import Thread\n")  # 5 hops: beyond the bound
    out = run_cli(cwd=project.root).out
    assert "pkg/job3.py:1:25: NJS201" in out
    assert "pkg/job5.py" not in out


# -- entry points -----------------------------------------------------------------------


def test_python_dash_m_and_self_test(lint_env: dict[str, str], tmp_path: pathlib.Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "nursery_jobs_lint", "--self-test"],
        cwd=tmp_path,
        env=lint_env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("nursery-jobs-lint self-test:") and result.stdout.rstrip().endswith(": ok")


def test_self_test_fails_when_a_rule_goes_silent(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import nursery_jobs_lint.checker as checker
    from nursery_jobs_lint.cli import main

    monkeypatch.setattr(checker, "DISTINCTIVE_SPAWN_ATTRS", frozenset())
    assert main(["--self-test"]) == 2
    assert "FAILED" in capsys.readouterr().err


def test_lint_package_imports_only_the_standard_library(lint_env: dict[str, str]) -> None:
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import nursery_jobs_lint, nursery_jobs_lint.cli, nursery_jobs_lint.flake8_plugin\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "std = set(sys.stdlib_module_names) | {'nursery_jobs_lint'}\n"
        "print(sorted(new - std))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], env=lint_env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


# -- self-application (§1.9 item 6) -----------------------------------------------------


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="needs the repository's git work tree")
def test_this_repository_passes_its_own_lint(run_cli: Run) -> None:
    result = run_cli("--config", str(REPO / "pyproject.toml"), cwd=REPO)
    assert result.code == 0, result.out + result.err


def test_real_globs_compile() -> None:
    table = real_lint_table()
    for key in ("include", "allow", "tests"):
        for glob in table[key]:  # type: ignore[attr-defined]
            compile_glob(glob, key=key, is_include=key == "include")


def test_pre_commit_files_declare_the_hook() -> None:
    hooks = (REPO / ".pre-commit-hooks.yaml").read_text(encoding="utf-8")
    for line in ("- id: nursery-jobs-lint", "entry: nursery-jobs-lint", "language: python", "types: [python]"):
        assert line in hooks
    own = (REPO / ".pre-commit-config.yaml").read_text(encoding="utf-8")
    for line in ('minimum_pre_commit_version: "4.4.0"', "repo: local", "entry: python -m nursery_jobs_lint", "language: unsupported"):
        assert line in own
