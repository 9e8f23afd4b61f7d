#!/usr/bin/env python3
"""CONTRIBUTING.md against the tree, and the sites of a new schedule that no compiler catches.

    python3 tests/check_contributing.py <repo root> [<markdown file>]

The markdown file defaults to <repo root>/CONTRIBUTING.md. Standard library only. Exits 1 and prints
one line per problem when:

- an inline code span of the page names a path that does not exist. A span is a path when it holds
  no space and no placeholder (<, >, {, }, $, a URL) and either contains '/' with a first component
  that exists at the root (src/..., tests/...) or ends in a known extension. A path with '/' is
  resolved from the root (globs allowed: presets/*.json); a bare file name (entry.hpp, or a glob
  such as *.cpp) must name some file of the repository. Fenced code blocks are not read.
- a schedule file of src/schedules/ (every .cpp but the shared common, entry, hazards, registry) is
  not named on the page, or names no ScheduleType value;
- a ScheduleType value of include/rotary/spec.hpp (`last` aside; `default_` is "default") lacks
  src/schedules/<name>.cpp, its &<name>_schedule in kScheduleEntries (src/schedules/registry.hpp),
  its ROTARY_SCHEDULE_<NAME> in include/rotary/rotary.h, its static_assert line in
  tests/test_schedule_registry.cpp, or ``<name>`` in python/rotary/_rope.py (Rope's docstring).
"""
from __future__ import annotations

import fnmatch
import glob
import os
import re
import subprocess
import sys

EXTENSIONS = (".cpp", ".hpp", ".h", ".cc", ".cu", ".c", ".py", ".cmake", ".txt", ".md", ".json", ".toml",
              ".in", ".map", ".npy", ".safetensors")
SHARED_SCHEDULE_FILES = {"common", "entry", "hazards", "registry"}
SKIPPED_DIRS = {".git", "__pycache__", "out"}


def repo_files(root: str) -> set[str]:
    """Paths relative to root: git's tracked and untracked-but-not-ignored files, else a walk that
    skips hidden and build folders."""
    try:
        listed = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard"],
                                capture_output=True, text=True, check=True).stdout.splitlines()
        return {p for p in listed if os.path.exists(os.path.join(root, p))}
    except (OSError, subprocess.CalledProcessError):
        found = set()
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.startswith((".", "build"))]
            for f in files:
                found.add(os.path.relpath(os.path.join(folder, f), root))
        return found


def code_spans(markdown: str) -> list[tuple[int, str]]:
    """(line number, text) of every inline code span outside fenced blocks."""
    spans = []
    fenced = False
    for number, line in enumerate(markdown.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        for match in re.finditer(r"(`+)(.+?)\1", line):
            spans.append((number, match.group(2).strip()))
    return spans


def is_path(span: str, top_level: set[str]) -> bool:
    if not span or any(c in span for c in " <>{}$") or "://" in span:
        return False
    if re.fullmatch(r"\.\w+", span):  # an extension alone: `.npy`
        return False
    if "/" in span:
        return span.split("/", 1)[0] in top_level or span.endswith(EXTENSIONS)
    return span.endswith(EXTENSIONS)


def check_paths(root: str, markdown: str, files: set[str], problems: list[str], page: str) -> None:
    top_level = set(os.listdir(root))
    basenames = {os.path.basename(f) for f in files}
    for number, span in code_spans(markdown):
        if not is_path(span, top_level):
            continue
        if "/" in span:
            target = os.path.join(root, span)
            ok = bool(glob.glob(target)) if any(c in span for c in "*?[") else os.path.exists(target)
        else:
            ok = any(fnmatch.fnmatchcase(name, span) for name in basenames)
        if not ok:
            problems.append(f"{page}:{number}: `{span}` names no file or folder of the repository")


def read(root: str, path: str, problems: list[str]) -> str:
    try:
        with open(os.path.join(root, path), encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        problems.append(f"{path}: cannot read it ({e.strerror})")
        return ""


def schedule_types(spec_hpp: str) -> list[str]:
    """The ScheduleType enumerators, in order, without aliases (`last = ...`)."""
    match = re.search(r"enum\s+class\s+ScheduleType\s*\{(.*?)\};", spec_hpp, re.S)
    if not match:
        return []
    body = re.sub(r"//[^\n]*", "", match.group(1))
    names = []
    for item in body.split(","):
        item = item.strip()
        if item and "=" not in item:
            names.append(item)
    return names


def check_schedules(root: str, markdown: str, problems: list[str], page: str) -> None:
    spec_hpp = read(root, "include/rotary/spec.hpp", problems)
    registry = read(root, "src/schedules/registry.hpp", problems)
    c_header = read(root, "include/rotary/rotary.h", problems)
    registry_test = read(root, "tests/test_schedule_registry.cpp", problems)
    python_init = read(root, "python/rotary/_rope.py", problems)
    if not spec_hpp:
        return
    enumerators = schedule_types(spec_hpp)
    if not enumerators:
        problems.append("include/rotary/spec.hpp: no `enum class ScheduleType { ... };` found")
        return
    entries = re.search(r"kScheduleEntries\s*=\s*\{(.*?)\};", registry, re.S)
    entries_text = entries.group(1) if entries else ""
    if registry and not entries:
        problems.append("src/schedules/registry.hpp: no `kScheduleEntries = { ... };` found")
    names = []
    for enumerator in enumerators:
        name = enumerator.rstrip("_")
        names.append(name)
        where = f"ScheduleType::{enumerator}"
        if not os.path.isfile(os.path.join(root, "src/schedules", name + ".cpp")):
            problems.append(f"{where}: src/schedules/{name}.cpp is missing")
        if entries_text and not re.search(rf"&\s*{name}_schedule\b", entries_text):
            problems.append(f"{where}: &{name}_schedule is not in kScheduleEntries (src/schedules/registry.hpp)")
        c_name = "ROTARY_SCHEDULE_" + name.upper()
        if c_header and not re.search(rf"\b{c_name}\s*=", c_header):
            problems.append(f"{where}: {c_name} is not a value of rotary_schedule_type (include/rotary/rotary.h)")
        assertion = rf"static_assert\(\s*{c_name}\s*==\s*static_cast<int>\(\s*ScheduleType::{enumerator}\s*\)\s*\)"
        if registry_test and not re.search(assertion, registry_test):
            problems.append(f"{where}: tests/test_schedule_registry.cpp lacks "
                            f"static_assert({c_name} == static_cast<int>(ScheduleType::{enumerator}))")
        if python_init and f"``{name}``" not in python_init:
            problems.append(f"{where}: ``{name}`` is not in Rope's docstring (python/rotary/_rope.py)")
    folder = os.path.join(root, "src/schedules")
    files = sorted(f[:-4] for f in os.listdir(folder) if f.endswith(".cpp")) if os.path.isdir(folder) else []
    for stem in files:
        if stem in SHARED_SCHEDULE_FILES:
            continue
        if stem not in names:
            problems.append(f"src/schedules/{stem}.cpp: no ScheduleType value names it "
                            f"(include/rotary/spec.hpp; the file name is the schedule's name)")
        if not re.search(rf"(?<![\w/.-]){re.escape(stem)}\.cpp\b", markdown) and \
                f"src/schedules/{stem}.cpp" not in markdown:
            problems.append(f"{page}: the schedule file src/schedules/{stem}.cpp is not named "
                            f"(the src/schedules/ line of the tree)")


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    root = os.path.abspath(argv[1])
    page_path = argv[2] if len(argv) == 3 else os.path.join(root, "CONTRIBUTING.md")
    try:
        with open(page_path, encoding="utf-8") as f:
            markdown = f.read()
    except OSError as e:
        print(f"{page_path}: cannot read it ({e.strerror})", file=sys.stderr)
        return 1
    page = os.path.relpath(page_path, root) if len(argv) == 2 else page_path
    problems: list[str] = []
    check_paths(root, markdown, repo_files(root), problems, page)
    check_schedules(root, markdown, problems, page)
    for problem in problems:
        print(problem)
    if problems:
        print(f"check_contributing: {len(problems)} problem(s)")
        return 1
    print("check_contributing: CONTRIBUTING.md and the schedule sites agree with the tree")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
