"""Which sources implement each public header (tools/lint/check_layers.py reads it): the view of a drawing
tool that places include/meshmuon/X.h in the folder of the source that implements it.

A source implements a header when it defines, out of line, something the header declares: a function
declared at namespace scope (matched by its qualified name and, for overloads, its first parameter's
type) or a member of a class the header defines. Comments, strings and preprocessor lines are blanked
first; the scan follows braces, so only namespace-scope definitions count (an anonymous namespace's
and `static` ones have internal linkage and implement nothing public).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

_TOKEN = re.compile(r'//[^\n]*|/\*.*?\*/|R"([^(]*)\(.*?\)\1"|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'',
                    re.S)
_PREPROCESSOR = re.compile(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.M)
_NAMESPACE = re.compile(r"(?:^|[;{}\s])(?:inline\s+)?namespace\s*([\w:]*)\s*$")
_EXTERN = re.compile(r'extern\s*""\s*$')
_CLASS = re.compile(r"(?:^|\s)(class|struct|union)\s+(?:\w+\s+)*?(\w+)\s*(?:final\s*)?(?::[^{]*)?$")
_NAME = re.compile(r"((?:\w+(?:<[^<>()]*>)?\s*::\s*)*(?:operator\s*(?:\(\)|[^\s(]+)|~?\w+))\s*$")
_SKIP_DECL = re.compile(r"^\s*(?:using|typedef|static_assert|friend|return|template|inline|constexpr|"
                        r"static|extern|enum)\b")


def blank(text: str) -> str:
    """Comments, string and character literals and preprocessor lines replaced by spaces (newlines kept)."""
    def space(m: re.Match) -> str:
        s = m.group(0)
        keep = '""' if s.startswith(('"', 'R"')) else ""
        return keep + re.sub(r"[^\n]", " ", s[len(keep):])
    return _PREPROCESSOR.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), _TOKEN.sub(space, text))


@dataclass
class Statement:
    text: str          # from the previous ; { or } up to (not including) the terminator
    end: str           # ";", "{" (a function body or other block) or "class" (a class body opens)
    namespace: tuple   # enclosing namespaces, outermost first ("" for an anonymous one)
    scope: str         # "ns" (namespace scope) or the enclosing class's qualified name


def statements(text: str):
    """Namespace- and class-scope statements of blanked C++ text, with where they sit."""
    stack: list[tuple[str, str]] = []  # (kind, name): kind ns | class | block
    start, parens = 0, 0
    for i, c in enumerate(text):
        if c in "()":
            parens += 1 if c == "(" else -1
            continue
        if c not in ";{}" or parens > 0:  # braces inside parentheses: `= {}` default arguments
            continue
        seg = text[start:i]
        start = i + 1
        if any(k == "block" for k, _ in stack):
            if c == "{":
                stack.append(("block", ""))
            elif c == "}":
                stack.pop()
            continue
        ns = tuple(part for k, n in stack if k == "ns" for part in n.split("::"))
        classes = [n for k, n in stack if k == "class"]
        scope = "::".join(classes) if classes else "ns"
        if c == ";":
            yield Statement(seg, ";", ns, scope)
        elif c == "{":
            if m := _NAMESPACE.search(seg):
                stack.append(("ns", m.group(1)))
                continue
            if _EXTERN.search(seg):
                stack.append(("extern", ""))
                continue
            if "(" not in seg and (m := _CLASS.search(seg)) and "=" not in seg:
                stack.append(("class", m.group(2)))
                yield Statement(seg, "class", ns, scope)
                continue
            yield Statement(seg, "{", ns, scope)
            stack.append(("block", ""))
        elif stack:
            stack.pop()


def _split_name(seg: str) -> tuple[str, str] | None:
    """(qualified name, parameter text) of the function a declaration or definition names, or None."""
    depth = 0
    for j, ch in enumerate(seg):
        if ch == "(" and depth == 0:
            head = seg[:j]
            if head.rstrip().endswith("operator"):
                if seg[j:j + 2] == "()":
                    j2 = seg.index("(", j + 2)
                    head, j = seg[:j2], j2
                else:
                    return None
            if "=" in re.sub(r"operator\s*[^\s(]+\s*$", "", head):
                return None  # a variable's initializer
            m = _NAME.search(head)
            if not m:
                return None
            name = re.sub(r"<[^<>()]*>|\s+", "", m.group(1))
            params, d = [], 0
            for ch2 in seg[j + 1:]:
                if ch2 == "(":
                    d += 1
                elif ch2 == ")":
                    if d == 0:
                        break
                    d -= 1
                params.append(ch2)
            return name, "".join(params)
        if ch in "<":
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
    return None


def first_param_type(params: str) -> str:
    """The last name component of the first parameter's type ("const std::string_view& n" -> string_view)."""
    first = params.split(",")[0]
    words = [w for w in re.findall(r"[\w:]+", re.sub(r"<.*", "", first))
             if w not in ("const", "volatile", "struct", "class", "unsigned", "signed")]
    if not words or words == ["void"]:
        return ""
    return words[0].split("::")[-1]


@dataclass
class HeaderDecls:
    functions: set = field(default_factory=set)  # (qualified name, first parameter's type)
    classes: set = field(default_factory=set)    # qualified names of the classes it defines


def header_decls(text: str) -> HeaderDecls:
    out = HeaderDecls()
    for st in statements(blank(text)):
        ns = [n for n in st.namespace]
        if st.end == "class":
            m = _CLASS.search(st.text)
            owner = ns + ([] if st.scope == "ns" else st.scope.split("::"))
            out.classes.add("::".join(owner + [m.group(2)]))
        elif st.end == ";" and st.scope == "ns" and "" not in ns and not _SKIP_DECL.search(st.text):
            if got := _split_name(st.text):
                name, params = got
                out.functions.add(("::".join(ns + [name]), first_param_type(params)))
    return out


def definitions(text: str) -> list[tuple[str, str]]:
    """(fully qualified name, first parameter's type) of each out-of-line function a source defines
    with external linkage."""
    out = []
    for st in statements(blank(text)):
        defaulted = st.end == ";" and re.search(r"::\s*(?:~?\w+|operator\s*[^\s(]+)\s*\(.*\)[^=]*=\s*default\s*$", st.text, re.S)
        if (st.end != "{" and not defaulted) or st.scope != "ns" or "" in st.namespace:
            continue
        if re.search(r"^\s*(?:template\s*<[^{]*>\s*)?static\b", st.text) or re.match(r"\s*(?:enum|union)\b", st.text):
            continue
        if got := _split_name(st.text):
            name, params = got
            out.append(("::".join(list(st.namespace) + [name]), first_param_type(params)))
    return out


def implementers(headers: dict[str, str], sources: dict[str, str]) -> dict[str, set[str]]:
    """For each public header (name -> text), the sources (path -> text) that implement it."""
    decls = {h: header_decls(t) for h, t in headers.items()}
    by_function, by_overload, by_class = {}, {}, {}
    for h, d in decls.items():
        for name, first in d.functions:
            by_function.setdefault(name, set()).add(h)
            by_overload[(name, first)] = h
        for c in d.classes:
            by_class[c] = h
    out: dict[str, set[str]] = {h: set() for h in headers}
    for path, text in sources.items():
        for name, first in definitions(text):
            parts = name.split("::")
            owner = next((by_class["::".join(parts[:k])] for k in range(len(parts) - 1, 0, -1)
                          if "::".join(parts[:k]) in by_class), None)
            if owner is None:
                owner = by_overload.get((name, first))
            if owner is None and len(by_function.get(name, ())) == 1:
                owner = next(iter(by_function[name]))
            if owner is not None:
                out[owner].add(path)
    return out
