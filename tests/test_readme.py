"""Every command README.md and the pages under docs/ show is runnable as written.

Commands are taken from each page's ```bash blocks, its 4-space indented lines and its
inline code spans that start with ``python scripts/`` or ``bash scripts/``.  Cheap ones
(``scripts/privacy.py``) run in full; for the others the script's own parser and, for
main.py, its flag -> config resolution must accept the arguments (no training here).
Relative links between the pages must point at files (and headings) that exist.
"""

import contextlib
import importlib
import io
import os
import pathlib
import re
import shlex

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README] + sorted((ROOT / "docs").glob("*.md"))


def page_commands(page: pathlib.Path) -> list[str]:
    text = page.read_text()
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


def readme_commands() -> list[str]:
    return page_commands(README)


COMMANDS = readme_commands()
CASES = [(page.relative_to(ROOT).as_posix(), command)
         for page in PAGES for command in page_commands(page)]


def _script(name: str):
    """The tool behind ``scripts/<name>.py`` (a shim into ``dclens.cli.<name>``)."""
    assert (ROOT / name).is_file(), f"{name} does not exist"
    return importlib.import_module(f"dclens.cli.{pathlib.Path(name).stem}")


def test_readme_has_the_commands_it_promises():
    assert "bash scripts/setup.sh" in COMMANDS
    assert "python scripts/main.py" in COMMANDS
    assert "python -m pytest -q" in COMMANDS
    assert any(c.startswith("python scripts/privacy.py") for c in COMMANDS)


def test_every_docs_page_is_collected():
    assert len(PAGES) > 1, "no docs/*.md pages found"
    pages_with_commands = {page for page, _ in CASES}
    assert "README.md" in pages_with_commands


@pytest.mark.parametrize("page, command", CASES,
                         ids=[f"{page}: {command}" for page, command in CASES])
def test_page_command_is_accepted(page, command):
    tokens = shlex.split(command, comments=True)
    while re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", tokens[0]):     # VAR=value prefixes
        tokens = tokens[1:]
    where = f"{page}: {command}"
    if tokens[0] == "bash":
        assert (ROOT / tokens[1]).is_file(), where
        return
    assert tokens[0] == "python", where
    if tokens[1] == "-m":
        assert tokens[2] == "pytest", where
        return
    assert (ROOT / tokens[1]).is_file(), f"{where}: no such script"
    module = _script(tokens[1])
    argv = tokens[2:]
    if tokens[1] == "scripts/privacy.py":
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert module.main(argv) == 0, where
        assert "epsilon" in out.getvalue() or "sigma" in out.getvalue()
        return
    try:
        args = module.build_parser().parse_args(argv)
    except SystemExit as error:          # argparse refused the arguments
        pytest.fail(f"{where}: refused by its parser (exit {error.code})")
    if tokens[1] == "scripts/main.py":
        module.resolve(args)             # flag values -> a valid config


def _anchors(page: pathlib.Path) -> set[str]:
    """GitHub's anchors for the headings of a markdown page (code blocks skipped)."""
    text = re.sub(r"^ *```.*?^ *```", "", page.read_text(), flags=re.S | re.M)
    anchors, seen = set(), {}
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_page_links_resolve(page):
    text = re.sub(r"^ *```.*?^ *```", "", page.read_text(), flags=re.S | re.M)
    broken = []
    for target in re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):                     # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or ROOT not in (linked, *linked.parents):
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: broken links {broken}"


#: Files that lived beside the repository while it was written (the design notes, the
#: baselines' fact sheet, the layout sketch): a reader of the repository does not have them,
#: so nothing may cite them; what the code needs from them is in docs/.
OUTSIDE_FILES = ("DESIGN.md", "BASELINES.md", "LAYOUT.md")


def _repository_text_files():
    """Text files of the project; os.walk (unlike Path.rglob) skips a folder that a job
    writing under results/ removes mid-scan, and atomic writes' temporaries are skipped."""
    for folder in ("dclens", "scripts", "tests", "docs", "results", "ops"):
        for directory, subfolders, files in os.walk(ROOT / folder):
            subfolders.sort()
            for name in sorted(files):
                path = pathlib.Path(directory) / name
                if path.suffix in {".py", ".md", ".cc", ".h", ".cu", ".sh", ".json"} and \
                        name != "test_readme.py" and not name.startswith(".tmp-"):
                    yield path
    yield README


def test_nothing_cites_a_file_outside_the_repository():
    """``docs/design.md`` is ours; ``DESIGN.md`` (upper case) was the notes beside the repo."""
    cited = []
    for path in _repository_text_files():
        try:
            text = path.read_text(errors="replace")
        except FileNotFoundError:       # replaced or removed by a running job meanwhile
            continue
        cited += [f"{path.relative_to(ROOT)}: {name}" for name in OUTSIDE_FILES
                  if re.search(rf"(?<![\w/]){re.escape(name)}", text)]
        cited += [f"{path.relative_to(ROOT)}: {hit}" for hit in
                  re.findall(r"shared/(?!authors-datalens)[\w./-]+", text)]
    assert not cited, "files outside the repository are cited:\n" + "\n".join(cited)
