"""Every command the README shows is runnable as written.

Commands are taken from the README's ```bash blocks, its 4-space indented lines and its
inline code spans that start with ``python scripts/`` or ``bash scripts/``.  Cheap ones
(``scripts/privacy.py``) run in full; for the others the script's own parser and, for
main.py, its flag -> config resolution must accept the arguments (no training here).
"""

import contextlib
import importlib.util
import io
import pathlib
import re
import shlex

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def readme_commands() -> list[str]:
    text = README.read_text()
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        lines += block.replace("\\\n", " ").splitlines()
    lines += re.findall(r"^    ((?:python|bash) scripts/.*)$", text, re.M)
    lines += [" ".join(span.split()) for span in
              re.findall(r"`((?:[A-Z_]+=\S+ )*(?:python|bash) scripts/[^`]+)`", text)]
    commands = []
    for line in lines:
        for part in line.split("&&"):
            if part.strip() and not part.strip().startswith("#"):
                commands.append(" ".join(part.split()))
    return sorted(set(commands))


COMMANDS = readme_commands()


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"readme_{pathlib.Path(name).stem}",
                                                  ROOT / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_has_the_commands_it_promises():
    assert "bash scripts/setup.sh" in COMMANDS
    assert "python scripts/main.py" in COMMANDS
    assert "python -m pytest -q" in COMMANDS
    assert any(c.startswith("python scripts/privacy.py") for c in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_is_accepted(command):
    tokens = shlex.split(command, comments=True)
    while re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", tokens[0]):     # VAR=value prefixes
        tokens = tokens[1:]
    if tokens[0] == "bash":
        assert (ROOT / tokens[1]).is_file(), command
        return
    assert tokens[0] == "python", command
    if tokens[1] == "-m":
        assert tokens[2] == "pytest", command
        return
    assert (ROOT / tokens[1]).is_file(), f"{command}: no such script"
    module = _script(tokens[1])
    argv = tokens[2:]
    if tokens[1] == "scripts/privacy.py":
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert module.main(argv) == 0, command
        assert "epsilon" in out.getvalue() or "sigma" in out.getvalue()
        return
    try:
        args = module.build_parser().parse_args(argv)
    except SystemExit as error:          # argparse refused the arguments
        pytest.fail(f"{command}: refused by its parser (exit {error.code})")
    if tokens[1] == "scripts/main.py":
        module.resolve(args)             # flag values -> a valid config
