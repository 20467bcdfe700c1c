#!/usr/bin/env python3
"""Lists C++ function bodies longer than a limit (default 80 lines), longest first.

usage: scripts/long_functions.py [--limit N] [PATH...]   (default: include examples)

A function is an outermost `{` whose header (the text since the previous `;`, `{` or `}`) has a
parameter list and is not a control statement or a lambda; its length runs from the header's
first line to the matching `}`. Comments, strings and character literals are ignored. Lambdas
and local classes count towards the function that holds them.
"""
import argparse
import pathlib
import re
import sys

CONTROL = re.compile(r"^(if|for|while|switch|catch|do|else|return|case)\b")
NOT_FUNCTION = re.compile(r"\b(class|struct|union|enum|namespace|concept)\b|=\s*$|\]\s*(\(|$)")


def strip(text):
    """Blanks comments and literals, keeping newlines so line numbers stay."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not text[i - 1].isalnum()):
            k = text.find("(", i)
            delim = ")" + text[i + 2 : k] + '"'
            j = text.find(delim, k)
            j = n if j < 0 else j + len(delim)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'" and not (c == "'" and i > 0 and text[i - 1].isalnum()):
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def drop_template_heads(h):
    """`template <class T> int f(T)` -> `int f(T)`, so the head's `class` is not a class."""
    while h.startswith("template"):
        depth, j = 0, h.find("<")
        if j < 0:
            return h
        for j in range(j, len(h)):
            depth += {"<": 1, ">": -1}.get(h[j], 0)
            if depth == 0:
                break
        h = h[j + 1 :].lstrip()
    return h


def functions(path):
    text = strip(path.read_text(errors="replace"))
    line_of = [0] * (len(text) + 1)
    line = 1
    for i, c in enumerate(text):
        line_of[i] = line
        line += c == "\n"
    stack, header_start, parens = [], 0, 0  # stack of (is_function, open offset, header offset, name)
    for i, c in enumerate(text):
        if c in "()":
            parens += 1 if c == "(" else -1
        elif c == "{" and (parens > 0 or re.search(r"\)\s*:[^{]*\w$", text[header_start:i].rstrip())):
            # a braced initialiser in a parameter list or a constructor's initialiser list
            stack.append((False, i, i, None))
        elif c == "{":
            in_function = any(f for f, *_ in stack)
            header = text[header_start:i].strip()
            h = drop_template_heads(re.sub(r"\s+", " ", header))
            is_fn = False
            name = ""
            if not in_function and "(" in h and not CONTROL.match(h) and not NOT_FUNCTION.search(h):
                sig = re.sub(r"\s*(try|const|noexcept(\(.*\))?|override|final|mutable|->.*)\s*$", "", h)
                sig = sig.split(" : ")[0] if ") : " in sig else sig
                m = re.search(r"([~\w:<>=!+\-*/\[\]&|^%]+)\s*\(", sig)
                if m and sig.rstrip().endswith(")") or m and h.endswith("try"):
                    is_fn, name = True, m.group(1)
            start = header_start + (len(text[header_start:i]) - len(text[header_start:i].lstrip()))
            stack.append((is_fn, i, start, name))
            header_start = i + 1
        elif c == "}":
            if stack:
                is_fn, _, start, name = stack.pop()
                if is_fn:
                    yield name, line_of[start], line_of[i] - line_of[start] + 1
                if name is None:
                    continue
            header_start = i + 1
        elif c == ";" and parens == 0:
            header_start = i + 1
        elif c == "#" and (i == 0 or text[i - 1] == "\n"):
            j = text.find("\n", i)
            while j > 0 and text[j - 1] == "\\":
                j = text.find("\n", j + 1)
            header_start = (len(text) if j < 0 else j) + 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=80)
    ap.add_argument("paths", nargs="*", default=["include", "examples"])
    args = ap.parse_args()
    rows = []
    for root in args.paths:
        p = pathlib.Path(root)
        files = [p] if p.is_file() else sorted(
            f for f in p.rglob("*") if f.suffix in (".hpp", ".cpp", ".h", ".cu", ".cuh"))
        for f in files:
            for name, line, length in functions(f):
                if length > args.limit:
                    rows.append((length, f"{f}:{line}", name))
    for length, where, name in sorted(rows, reverse=True):
        print(f"{length:5d}  {where}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
