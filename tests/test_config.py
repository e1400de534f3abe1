from __future__ import annotations

from pathlib import Path

import pytest

from oom_lsp.analysis import registry
from oom_lsp.analysis.findings import Severity
from oom_lsp.config import (
    DEFAULT_EXCLUDE,
    ConfigError,
    ConfigResolver,
    GlobPattern,
    UserConfig,
    find_pyproject,
    load_config,
    load_user_config,
    parse_config_table,
    parse_memory_size,
    user_config_path,
)

ORIGIN = "pyproject.toml: [tool.oom-lsp]"
# Codes of the OOM5 family, whatever rules it has grown.
OOM5 = frozenset(code for code in registry.all_codes() if code.startswith("OOM5"))
ROOT = Path("/project")


def parse(table: dict) -> object:
    return parse_config_table(table, ORIGIN, ROOT)


def error_of(table: dict) -> str:
    with pytest.raises(ConfigError) as raised:
        parse(table)
    return str(raised.value)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- every key ------------------------------------------------------------------


def test_defaults() -> None:
    config = parse({})
    assert config.select is None and config.extend_select == () and config.ignore == ()
    assert config.max_batch_size == 32
    assert config.gpu_memory is None
    assert config.respect_gitignore is True
    assert config.exclude == DEFAULT_EXCLUDE
    assert config.settings_for(ROOT / "train.py").enabled == frozenset(registry.default_codes())


def test_every_key_kebab_case() -> None:
    config = parse(
        {
            "select": ["OOM5"],
            "extend-select": ["OOM900"],
            "ignore": ["OOM000"],
            "per-file-ignores": {"tests/**": ["OOM501"]},
            "exclude": ["legacy"],
            "extend-exclude": ["scratch/*.py"],
            "respect-gitignore": False,
            "max-batch-size": 64,
            "severity": {"OOM501": "error"},
            "gpu-memory": "24GiB",
            "llm": {
                "enabled": True,
                "base-url": "http://localhost:8000/v1",
                "model": "qwen",
                "api-key-env": "MY_KEY",
                "timeout": 30.5,
                "response-format": "json_schema",
            },
        }
    )
    assert config.select == ("OOM5",)
    assert config.extend_select == ("OOM900",)
    assert config.ignore == ("OOM000",)
    assert config.per_file_ignores == {"tests/**": ("OOM501",)}
    assert config.exclude == ("legacy",)
    assert config.extend_exclude == ("scratch/*.py",)
    assert config.respect_gitignore is False
    assert config.max_batch_size == 64
    assert config.severity == {"OOM501": Severity.ERROR}
    assert config.gpu_memory == 24 * 2**30
    assert config.llm["base-url"] == "http://localhost:8000/v1"
    assert config.llm["timeout"] == 30.5
    settings = config.settings_for(ROOT / "src" / "train.py")
    assert settings.enabled == OOM5 | {"OOM900"}
    assert settings.max_batch_size == 64
    assert settings.severity == {"OOM501": Severity.ERROR}


def test_the_budget_gate_keys() -> None:
    config = parse(
        {
            "budget": "24GiB",
            "estimate-scripts": ["train.py --epochs 1", "finetune.py --config 'a b.yaml'"],
            "budget-baseline": "ci/memory.json",
            "budget-max-growth": "2.5%",
            "estimate-timeout": 120,
        }
    )
    assert config.budget == 24 * 2**30
    assert config.estimate_scripts == ("train.py --epochs 1", "finetune.py --config 'a b.yaml'")
    assert config.budget_baseline == "ci/memory.json"
    assert config.budget_max_growth == 2.5
    assert config.estimate_timeout == 120.0
    assert parse({"budget-max-growth": 10}).budget_max_growth == 10.0  # a number is percent
    assert parse({}).budget is None and parse({}).estimate_scripts == ()


def test_camel_case_keys_from_editor_settings() -> None:
    config = parse(
        {
            "maxBatchSize": 8,
            "perFileIgnores": {"*.py": ["OOM501"]},
            "gpuMemory": "80GiB",
            "extendSelect": ["OOM900"],
            "respectGitignore": False,
            "llm": {"baseUrl": "http://x", "apiKeyEnv": "K", "responseFormat": "text"},
        }
    )
    assert config.max_batch_size == 8
    assert config.per_file_ignores == {"*.py": ("OOM501",)}
    assert config.gpu_memory == 80 * 2**30
    assert config.extend_select == ("OOM900",)
    assert config.respect_gitignore is False
    assert config.llm == {"base-url": "http://x", "api-key-env": "K", "response-format": "text"}


def test_rule_names_and_all_are_selectors() -> None:
    config = parse({"select": ["torch-load-without-map-location"]})
    assert config.settings_for(ROOT / "a.py").enabled == {"OOM501"}
    assert parse({"select": ["ALL"]}).settings_for(ROOT / "a.py").enabled == set(registry.all_codes())


# --- errors name the file and the key --------------------------------------------------


def test_unknown_key_suggests_the_closest() -> None:
    assert error_of({"selct": ["OOM5"]}) == f"{ORIGIN} selct: unknown key; did you mean 'select'?"
    assert "did you mean 'max-batch-size'?" in error_of({"max_batch_size": 4})
    assert "llm.modle: unknown key; did you mean 'model'?" in error_of({"llm": {"modle": "x"}})


def test_unknown_key_without_close_match_lists_keys() -> None:
    message = error_of({"zzz": 1})
    assert message.startswith(f"{ORIGIN} zzz: unknown key; known keys:")
    assert "per-file-ignores" in message


def test_unknown_code() -> None:
    assert error_of({"select": ["OOM999"]}) == f"{ORIGIN} select: unknown rule selector 'OOM999'"
    assert "ignore: unknown rule selector 'E501'" in error_of({"ignore": ["E501"]})
    assert "per-file-ignores.'tests/*': unknown rule selector 'OOM9999'" in error_of(
        {"per-file-ignores": {"tests/*": ["OOM9999"]}}
    )
    assert "severity.OOM999: unknown rule selector" in error_of({"severity": {"OOM999": "info"}})


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ({"select": "OOM501"}, None),  # a comma-separated string is accepted
        ({"select": [1]}, "select: expected an array of strings, got an array"),
        ({"max-batch-size": "32"}, "max-batch-size: expected a positive integer, got '32'"),
        ({"max-batch-size": 0}, "max-batch-size: expected a positive integer, got 0"),
        ({"max-batch-size": True}, "max-batch-size: expected a positive integer, got True"),
        ({"respect-gitignore": "yes"}, "respect-gitignore: expected a boolean, got a string"),
        ({"severity": {"OOM501": "fatal"}}, "severity.OOM501: expected one of error, warning, info, hint"),
        ({"severity": ["OOM501"]}, "severity: expected a table of code = severity, got an array"),
        ({"per-file-ignores": ["x"]}, "per-file-ignores: expected a table of glob = [codes], got an array"),
        ({"gpu-memory": "lots"}, "gpu-memory: expected a size such as"),
        ({"gpu-memory": 1.5}, 'gpu-memory: expected a size such as "24GiB", got a number'),
        ({"gpu-memory": True}, 'gpu-memory: expected a size such as "24GiB", got a boolean'),
        ({"llm": {"enabled": "yes"}}, "llm.enabled: expected a boolean, got a string"),
        ({"llm": {"base-url": 3}}, "llm.base-url: expected a string, got an integer"),
        ({"llm": {"timeout": "10"}}, "llm.timeout: expected a positive number of seconds"),
        ({"llm": {"response-format": "xml"}}, "llm.response-format: expected one of text, json_schema"),
        ({"llm": "on"}, "llm: expected a table, got a string"),
        ({"llm": {"timeout": float("nan")}}, "llm.timeout: expected a positive number of seconds, got nan"),
        ({"llm": {"timeout": float("inf")}}, "llm.timeout: expected a positive number of seconds, got inf"),
        ({"llm": {"model": " "}}, "llm.model: expected a value, got an empty string"),
        ({"llm": {"base-url": "localhost:11434"}}, "llm.base-url: expected an http:// or https:// URL"),
        ({"llm": {"base-url": "file:///etc/passwd"}}, "llm.base-url: expected an http:// or https:// URL"),
        ({"llm": {"api-key-env": "$HOME"}}, "llm.api-key-env: expected the name of an environment variable"),
        ({"budget": "24 furlongs"}, "budget: expected a size such as"),
        (
            {"budget-max-growth": "lots"},
            "budget-max-growth: expected a percentage such as 5 or \"5%\", got 'lots'",
        ),
        ({"budget-max-growth": -1}, "budget-max-growth: expected a percentage of 0 or more, got -1"),
        ({"budget-baseline": ""}, "budget-baseline: expected a file path, got ''"),
        (
            {"estimate-scripts": "train.py"},
            'estimate-scripts: expected an array of strings such as ["train.py',
        ),
        ({"estimate-scripts": ["a.py", " "]}, "estimate-scripts[1]: expected a script and its arguments"),
        ({"estimate-scripts": ["a.py 'b"]}, "estimate-scripts[0]: No closing quotation"),
        ({"estimate-timeout": 0}, "estimate-timeout: expected a positive number of seconds, got 0"),
    ],
)
def test_wrong_types_name_the_key(table: dict, expected: str | None) -> None:
    if expected is None:
        assert parse(table).select == ("OOM501",)
    else:
        assert expected in error_of(table)
        assert error_of(table).startswith(ORIGIN + " ")


def test_key_given_twice_in_two_spellings() -> None:
    assert "given twice" in error_of({"max-batch-size": 1, "maxBatchSize": 2})


# --- units ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("24GiB", 24 * 2**30),
        ("24 GB", 24 * 10**9),
        ("80GiB", 80 * 2**30),
        ("24000MiB", 24000 * 2**20),
        ("16gib", 16 * 2**30),
        ("1.5 GiB", int(1.5 * 2**30)),
        ("512", 512),
        (1024, 1024),
    ],
)
def test_memory_units(text: str | int, size: int) -> None:
    assert parse_memory_size(text) == size


@pytest.mark.parametrize("text", ["", "GiB", "24 XB", "-1GiB", "0", 0, "24 GiB extra"])
def test_memory_units_rejected(text: str | int) -> None:
    with pytest.raises(ValueError):
        parse_memory_size(text)


# --- per-file-ignores, severity prefixes, exclude -----------------------------------------


def test_per_file_ignores_globs_relative_to_root() -> None:
    config = parse(
        {
            "per-file-ignores": {
                "tests/**": ["OOM501"],
                "scripts/*.py": ["OOM000"],
                "__init__.py": ["OOM5"],
                "notebooks/export_?.py": ["OOM501"],
            }
        }
    )

    def ignored(relative: str) -> frozenset[str]:
        return config.ignored_codes_for(ROOT / relative)

    assert ignored("tests/test_train.py") == {"OOM501"}
    assert ignored("tests/deep/nested/test_x.py") == {"OOM501"}
    assert ignored("src/tests/test_x.py") == frozenset()  # anchored at the root
    assert ignored("scripts/run.py") == {"OOM000"}
    assert ignored("scripts/sub/run.py") == frozenset()  # `*` stays in one folder
    assert ignored("pkg/sub/__init__.py") == OOM5  # a bare name matches anywhere
    assert ignored("notebooks/export_1.py") == {"OOM501"}
    assert ignored("notebooks/export_12.py") == frozenset()
    assert "OOM501" not in config.settings_for(ROOT / "tests" / "a.py").enabled
    assert "OOM501" in config.settings_for(ROOT / "src" / "a.py").enabled


def test_severity_prefix_expanded_and_code_beats_prefix() -> None:
    config = parse({"severity": {"OOM501": "hint", "OOM5": "info", "OOM": "error"}})
    severity = config.settings_for(ROOT / "a.py").severity
    assert severity["OOM501"] is Severity.HINT
    assert severity["OOM000"] is Severity.ERROR
    assert set(severity) == set(registry.all_codes())


def test_settings_fingerprint_differs_with_per_file_ignores() -> None:
    config = parse({"per-file-ignores": {"tests/*": ["OOM501"]}})
    assert (
        config.settings_for(ROOT / "tests" / "a.py").fingerprint()
        != config.settings_for(ROOT / "a.py").fingerprint()
    )
    assert config.settings_for(ROOT / "b.py") is config.settings_for(ROOT / "a.py")


def test_exclude_by_name_and_by_path() -> None:
    config = parse({"extend-exclude": ["legacy/*.py", "generated_*"]})
    assert config.is_excluded(ROOT / ".venv")
    assert config.is_excluded(ROOT / "sub" / "node_modules")
    assert config.is_excluded(ROOT / "legacy" / "old.py")
    assert not config.is_excluded(ROOT / "src" / "legacy" / "old.py")
    assert config.is_excluded(ROOT / "src" / "generated_model.py")
    assert not config.is_excluded(ROOT / "src" / "model.py")


def test_include_takes_python_and_notebooks_by_default_and_can_be_narrowed_or_extended() -> None:
    default = parse({})
    included = [default.is_included(ROOT / name) for name in ("a.py", "b.pyi", "nb.ipynb", "c.pyw")]
    assert included == [True, True, True, False]
    scripts_only = parse({"include": ["*.py"], "extend-include": ["notebooks/*.ipynb", "*.pyw"]})
    assert not scripts_only.is_included(ROOT / "nb.ipynb")
    assert scripts_only.is_included(ROOT / "notebooks" / "nb.ipynb")
    assert scripts_only.is_included(ROOT / "tool.pyw") and not scripts_only.is_included(ROOT / "b.pyi")
    assert parse({"extendInclude": "*.pyw"}).extend_include == ("*.pyw",)  # an editor's camelCase


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("**/test_*.py", "test_a.py", True),
        ("**/test_*.py", "a/b/test_a.py", True),
        ("src/**", "src/a/b.py", True),
        ("[ab].py", "a.py", True),
        ("[!ab].py", "a.py", False),
        ("./src/*.py", "src/x.py", True),
        ("/src/*.py", "src/x.py", True),
        ("src/", "src", True),
    ],
)
def test_glob_pattern(pattern: str, path: str, matches: bool) -> None:
    assert GlobPattern(pattern).matches(path) is matches


# --- files --------------------------------------------------------------------------------


def test_load_config_and_bad_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    good = write(
        tmp_path / "a" / "pyproject.toml", '[tool.oom-lsp]\nselect = ["OOM501"]\nmax-batch-size = 16\n'
    )
    config = load_config(good)
    assert config.path == good and config.root == good.parent.resolve()
    assert config.max_batch_size == 16
    bad = write(tmp_path / "b" / "pyproject.toml", "[tool.oom-lsp]\nselect = [OOM501]\n")
    with pytest.raises(ConfigError) as raised:
        load_config(bad)
    message = str(raised.value)
    assert message.startswith(str(Path("b") / "pyproject.toml") + ": invalid TOML: ")
    assert "line 2" in message and "column" in message


def test_load_config_error_names_file_and_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "pyproject.toml", '[tool.oom-lsp]\nselect = ["OOM999"]\n')
    with pytest.raises(ConfigError) as raised:
        load_config(tmp_path / "pyproject.toml")
    assert str(raised.value) == "pyproject.toml: [tool.oom-lsp] select: unknown rule selector 'OOM999'"


def test_find_pyproject_skips_those_without_the_table(tmp_path: Path) -> None:
    outer = write(tmp_path / "pyproject.toml", "[tool.oom-lsp]\nmax-batch-size = 8\n")
    write(tmp_path / "pkg" / "pyproject.toml", '[project]\nname = "pkg"\n[tool.ruff]\nline-length = 100\n')
    script = write(tmp_path / "pkg" / "src" / "train.py", "")
    assert find_pyproject(script) == outer
    inner = write(tmp_path / "pkg" / "src" / "pyproject.toml", "[tool.oom-lsp]\n")
    assert find_pyproject(script) == inner
    assert find_pyproject(script.parent) == inner


def test_find_pyproject_none(tmp_path: Path) -> None:
    script = write(tmp_path / "train.py", "")
    assert find_pyproject(script) is None


def test_find_pyproject_keeps_a_broken_one_that_mentions_the_tool(tmp_path: Path) -> None:
    broken = write(tmp_path / "pyproject.toml", "[tool.oom-lsp\nselect = 1\n")
    assert find_pyproject(write(tmp_path / "x.py", "")) == broken


# --- the resolver ---------------------------------------------------------------------------


def test_resolver_nearest_pyproject_and_cache(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", "[tool.oom-lsp]\nmax-batch-size = 8\n")
    write(tmp_path / "sub" / "pyproject.toml", "[tool.oom-lsp]\nmax-batch-size = 128\n")
    resolver = ConfigResolver(fallback_root=tmp_path)
    top = resolver.resolve(tmp_path / "a.py")
    assert top.max_batch_size == 8 and top.root == tmp_path
    assert resolver.resolve(tmp_path / "sub" / "deeper" / "b.py").max_batch_size == 128
    assert resolver.resolve(tmp_path / "c.py") is top
    write(tmp_path / "pyproject.toml", "[tool.oom-lsp]\nmax-batch-size = 9\n")
    assert resolver.resolve(tmp_path / "a.py").max_batch_size == 8  # cached
    resolver.invalidate()
    assert resolver.resolve(tmp_path / "a.py").max_batch_size == 9


def test_resolver_overrides_layer_over_the_pyproject(tmp_path: Path) -> None:
    write(
        tmp_path / "pyproject.toml",
        '[tool.oom-lsp]\nselect = ["OOM5"]\nignore = ["OOM000"]\nmax-batch-size = 8\n',
    )
    file = tmp_path / "a.py"
    assert ConfigResolver().resolve(file).settings_for(file).enabled == OOM5
    ignoring = ConfigResolver(overrides={"ignore": ["OOM501"]}).resolve(file)
    assert ignoring.settings_for(file).enabled == OOM5 - {"OOM501"}
    extending = ConfigResolver(overrides={"extend-select": ["OOM000"]}).resolve(file)
    assert extending.settings_for(file).enabled == OOM5 | {"OOM000"}
    selecting = ConfigResolver(overrides={"select": ["OOM000"], "max-batch-size": 2}).resolve(file)
    assert selecting.settings_for(file).enabled == {"OOM000"}
    assert selecting.max_batch_size == 2
    assert selecting.select == ("OOM5",)  # the file's own layer is kept for reference


def test_resolver_editor_defaults_fill_only_what_the_project_leaves_unsaid(tmp_path: Path) -> None:
    write(tmp_path / "configured" / "pyproject.toml", '[tool.oom-lsp]\nignore = ["OOM000"]\n')
    write(tmp_path / "plain" / "pyproject.toml", "[tool.oom-lsp]\nmax-batch-size = 4\n")
    defaults = {"select": ["OOM000"], "extendSelect": ["OOM900"], "maxBatchSize": 64, "gpuMemory": "24GiB"}
    resolver = ConfigResolver(defaults=defaults)
    configured = resolver.resolve(tmp_path / "configured" / "a.py")
    # The project owns rule selection, so the editor's select is not used.
    assert configured.settings_for(tmp_path / "configured" / "a.py").enabled == frozenset(
        set(registry.default_codes()) - {"OOM000"}
    )
    assert configured.max_batch_size == 64 and configured.gpu_memory == 24 * 2**30
    plain = resolver.resolve(tmp_path / "plain" / "a.py")
    assert plain.settings_for(tmp_path / "plain" / "a.py").enabled == {"OOM000", "OOM900"}
    assert plain.max_batch_size == 4


def test_resolver_without_pyproject_uses_fallback_root(tmp_path: Path) -> None:
    resolver = ConfigResolver(fallback_root=tmp_path, config_file=None)
    config = resolver.resolve(tmp_path / "lonely" / "x.py")
    assert config.path is None and config.root == tmp_path
    assert config.settings_for(tmp_path / "lonely" / "x.py").enabled == frozenset(registry.default_codes())


def test_resolver_config_file_replaces_discovery(tmp_path: Path) -> None:
    write(tmp_path / "project" / "pyproject.toml", "[tool.oom-lsp]\nmax-batch-size = 8\n")
    explicit = write(tmp_path / "ci" / "oom-lsp.toml", 'max-batch-size = 256\nselect = ["OOM501"]\n')
    resolver = ConfigResolver(config_file=explicit)
    config = resolver.resolve(tmp_path / "project" / "a.py")
    assert config.max_batch_size == 256 and config.path == explicit
    bad = write(tmp_path / "ci" / "bad.toml", "selct = []\n")
    with pytest.raises(ConfigError, match=r"bad\.toml selct: unknown key; did you mean 'select'"):
        ConfigResolver(config_file=bad).resolve(tmp_path / "a.py")
    with pytest.raises(ConfigError, match="no such configuration file"):
        ConfigResolver(config_file=tmp_path / "missing.toml")


def test_resolver_errors_name_their_origin() -> None:
    with pytest.raises(ConfigError, match=r"^command line select: unknown rule selector 'OOM999'$"):
        ConfigResolver(overrides={"select": ["OOM999"]})
    with pytest.raises(ConfigError, match=r"^editor settings maxBatchSiz: unknown key; did you mean"):
        ConfigResolver(defaults={"maxBatchSiz": 3})


@pytest.mark.parametrize("nested", ["[" * 2000 + "]" * 2000, "{a = " * 2000 + "1" + "}" * 2000])
def test_a_deeply_nested_value_is_a_config_error(tmp_path: Path, nested: str) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(f"[tool.oom-lsp]\nselect = {nested}\n")
    with pytest.raises(ConfigError, match="invalid TOML: arrays or inline tables nested too deeply"):
        ConfigResolver().resolve(tmp_path / "train.py")


def test_the_user_config_file(tmp_path: Path) -> None:
    path = tmp_path / "oom-lsp" / "config.toml"
    assert user_config_path({"XDG_CONFIG_HOME": str(tmp_path)}) == path
    assert load_user_config(path) == UserConfig()  # no file: nothing configured
    path.parent.mkdir()
    path.write_text('trusted-projects = ["~/src/mine"]\n[llm]\nenabled = true\nbaseUrl = "http://localhost:1/v1"\n')
    config = load_user_config(path)
    assert config.llm == {"enabled": True, "base-url": "http://localhost:1/v1"}
    assert config.trusted_projects == (Path.home() / "src" / "mine",)
    path.write_text("[llm]\nmodle = 'x'\n")
    with pytest.raises(ConfigError, match="llm.modle: unknown key; did you mean 'model'"):
        load_user_config(path)
    path.write_text("trust = []\n")
    with pytest.raises(ConfigError, match="trust: unknown key; known keys: llm, trusted-projects"):
        load_user_config(path)


def test_a_string_where_a_toml_file_needs_an_array_is_an_error_naming_the_key(tmp_path: Path) -> None:
    """`select = "OOM301"` in a file is a slip (editor settings and shells may give a
    comma-separated string; a file has arrays)."""
    pyproject = tmp_path / "pyproject.toml"
    for key in ("select", "ignore", "extend-exclude"):
        pyproject.write_text(f'[tool.oom-lsp]\n{key} = "OOM301"\n')
        with pytest.raises(ConfigError) as error:
            ConfigResolver().resolve(tmp_path / "a.py")
        assert str(error.value).endswith(
            f'pyproject.toml: [tool.oom-lsp] {key}: expected an array of strings such as ["OOM301"], got a string'
        )
    user = tmp_path / "config.toml"
    user.write_text('trusted-projects = "~/src"\n')
    with pytest.raises(ConfigError, match=r"trusted-projects: expected an array of strings"):
        load_user_config(user)
    # Editor settings may still send a comma-separated string.
    pyproject.unlink()
    resolver = ConfigResolver(defaults={"select": "OOM301,OOM501"}, fallback_root=tmp_path)
    assert resolver.resolve(tmp_path / "b.py").enabled == frozenset({"OOM301", "OOM501"})
