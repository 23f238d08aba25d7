#!/usr/bin/env python3
"""The house style, checked on every tracked C++ source (STYLE.md):

  1. clang-format (the repository's .clang-format) changes nothing;
  2. no source file is longer than 800 lines;
  3. no function outside tests/ is longer than 100 lines, from the first
     line of its signature to its closing brace.

Functions are found on the formatted text: comments, string and character
literals are blanked, then every "{" whose head (the text since the last
";", "{" or "}") reads as a function signature opens a function: it has a
parameter list and is not a control statement, a lambda, a class, a
namespace or an initializer. Only the outermost function counts: a lambda
or a local class inside it is part of its length.

Usage: check_style.py ROOT [--clang-format BINARY]   (tracked files: git ls-files)
       check_style.py --self-test [--clang-format BINARY]
Exit 0 when every file follows the style, 1 listing each violation.
"""
import os
import re
import subprocess
import sys
import tempfile

SOURCES = (".cc", ".h", ".cu", ".cuh")
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 100
CONTROL = re.compile(r"^(if|for|while|switch|catch|else|do|try|return|case)\b")
NOT_FUNCTION = re.compile(r"\b(namespace|class|struct|union|enum)\b|^extern\b")


def blank_literals(text):
    """`text` with comments and string/char literals replaced by spaces
    (newlines kept, so line numbers stay)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not text[i - 1].isalnum()):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # digit separator 1'000
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def is_function_head(head):
    head = " ".join(head.split())
    if "(" not in head or ")" not in head:
        return False
    before = head.split("(")[0]
    if CONTROL.match(head) or NOT_FUNCTION.search(before):
        return False
    if "=" in before or before.rstrip().endswith("]") or before.strip() == "":
        return False  # an initializer, a lambda, a parenthesized expression
    if re.search(r"\]\s*(\([^)]*\))?\s*(mutable\s*)?(->[^{]*)?$", head):
        return False  # a lambda: [..](..) {
    return True


def long_functions(text, limit=MAX_FUNCTION_LINES):
    """(first line, last line, name) of each outermost function over `limit` lines."""
    code = blank_literals(text)
    # Preprocessor lines are not heads.
    code = "\n".join("" if line.lstrip().startswith("#") else line for line in code.split("\n"))
    found = []
    stack = []  # per open brace: whether it opens a function
    head_start = 0
    line = 1
    for i, c in enumerate(code):
        if c == "\n":
            line += 1
        elif c == "{":
            head = code[head_start:i]
            inside = any(opened for opened, _, _ in stack)
            opens = not inside and is_function_head(head)
            if opens:
                first = line - head.lstrip().count("\n")
                words = head.split("(")[0].split()
                name = words[-1] if words else "?"
                stack.append((True, first, name))
            else:
                stack.append((False, 0, ""))
            head_start = i + 1
        elif c == "}":
            if stack:
                opened, first, name = stack.pop()
                if opened and line - first + 1 > limit:
                    found.append((first, line, name))
            head_start = i + 1
        elif c == ";":
            head_start = i + 1
    return found


def tracked_sources(root):
    out = subprocess.run(["git", "-C", root, "ls-files"], check=True, capture_output=True,
                         text=True).stdout.split()
    return [f for f in out if f.endswith(SOURCES) and os.path.isfile(os.path.join(root, f))]


def format_differences(root, files, clang_format):
    bad = []
    for k in range(0, len(files), 50):
        batch = [os.path.join(root, f) for f in files[k:k + 50]]
        r = subprocess.run([clang_format, "--dry-run", "--Werror", "--style=file"] + batch,
                           capture_output=True, text=True, cwd=root)
        if r.returncode != 0:
            for f in batch:
                one = subprocess.run([clang_format, "--dry-run", "--Werror", "--style=file", f],
                                     capture_output=True, text=True, cwd=root)
                if one.returncode != 0:
                    count = one.stderr.count("warning:") or 1
                    bad.append(f"{os.path.relpath(f, root)}: clang-format would change it "
                               f"({count} place(s)); run clang-format -i on it")
    return bad


def violations(root, files, clang_format):
    found = format_differences(root, files, clang_format)
    for f in files:
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        if lines > MAX_FILE_LINES:
            found.append(f"{f}: {lines} lines, over {MAX_FILE_LINES}: split it")
        if f.startswith("tests/"):
            continue
        for first, last, name in long_functions(text):
            found.append(f"{f}:{first}: {name}() is {last - first + 1} lines (to line {last}), "
                         f"over {MAX_FUNCTION_LINES}")
    return found


def self_test(clang_format):
    n = MAX_FUNCTION_LINES
    body = "".join(f"  x += {i};\n" for i in range(n - 1))
    ok_fn = "int Fine(int x) {\n" + "".join(body.splitlines(True)[:n - 3]) + "  return x;\n}\n"
    long_fn = "int TooLong(int x) {\n" + body + "  return x;\n}\n"
    lambda_in_fn = ("void Outer() {\n  auto f = [&](int y) {\n" + body + "    return y;\n  };\n}\n")
    not_fns = ("namespace a {\nstruct S {\n" + "".join(f"  int m{i} = {i};\n" for i in range(130))
               + "};\n}  // namespace a\n")
    cases = {
        "lib/long.cc": long_fn,                       # a function of n + 2 lines
        "lib/lambda.cc": lambda_in_fn,                # a lambda counts toward its function
        "lib/big.h": "".join(f"int v{i} = {i};\n" for i in range(801)),  # 801 lines
        "lib/ugly.cc": "int  f( int x ){return x;}\n",  # clang-format changes it
        "tests/big_test.cc": "".join(f"int t{i} = {i};\n" for i in range(801)),
    }
    fine = {
        "lib/fine.cc": ok_fn,                         # exactly n lines
        "lib/types.h": not_fns,                       # a long struct is not a function
        "tests/long_test.cc": long_fn,                # tests may have long functions
        "lib/strings.cc": 'const char* s = "{ not a block";\nint g() { return 1; }\n',
    }
    with tempfile.TemporaryDirectory() as root:
        with open(os.path.join(root, ".clang-format"), "w") as f:
            f.write("BasedOnStyle: Google\nColumnLimit: 100\n")
        for rel, text in {**cases, **fine}.items():
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        # The fixtures are formatted, but for the one that must not be.
        for rel in list(cases) + list(fine):
            if rel != "lib/ugly.cc" and rel.endswith((".cc", ".h")):
                subprocess.run([clang_format, "-i", "--style=file", os.path.join(root, rel)],
                               check=True, cwd=root)
        sources = sorted(r for r in {**cases, **fine} if r.endswith(SOURCES))
        found = violations(root, sources, clang_format)
    bad = {v.split(":")[0] for v in found}
    if bad != set(cases):
        print("self-test failed: expected violations in", sorted(cases), "got", found)
        return 1
    print("self-test: all", len(cases), "violations found, none in the allowed files")
    return 0


def main(argv):
    clang_format = "clang-format"
    if "--clang-format" in argv:
        k = argv.index("--clang-format")
        clang_format = argv[k + 1]
        argv = argv[:k] + argv[k + 2:]
    if argv[1:] == ["--self-test"]:
        return self_test(clang_format)
    if len(argv) != 2:
        print(__doc__)
        return 2
    root = argv[1]
    files = tracked_sources(root)
    found = violations(root, files, clang_format)
    for v in found:
        print(v)
    if found:
        print(f"{len(found)} violation(s) of the house style in {len(files)} files")
        return 1
    print(f"{len(files)} files follow the house style")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
