"""Write docs/guide/api.md, the API reference, from the docstrings.

    python docs/make_api.py          # rewrite docs/guide/api.md
    python docs/make_api.py --check  # exit 1 if it is out of date

Each public module of the reference lists its public names (``__all__``,
else the names without a leading underscore defined there) with their
signatures and the first paragraph of their docstrings; classes list their
public methods and properties the same way. A numpydoc ``Parameters``
section of a docstring is carried too, as a list under its name.
``tests/test_docs_api.py`` checks that the committed page is what this
script writes.
"""

import importlib
import inspect
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "guide" / "api.md"

#: (module, what it is), in the order of the page; the top level first
MODULES = [
    ("radix_soa", "the product: the caches, the router index, batches, events, results"),
    ("radix_soa.studies.traces", "loading real request traces"),
    ("radix_soa.studies.workloads", "seeded built-in workloads"),
    ("radix_soa.studies.catalog", "the public traces and their download"),
    ("radix_soa.studies.report", "the capacity study's table and units"),
    ("radix_soa.dask", "a set of sequences sharded over Dask workers (the dask extra)"),
    ("radix_soa.service", "the router service, radix-soa router (the router extra)"),
    ("radix_soa.integrations.vllm", "following vLLM's KV-event publishers into a RouterIndex "
                                    "(the vllm extra)"),
    ("radix_soa.integrations.vllm_wire", "the wire format of vLLM's KV events, and a "
                                         "publisher writing it (the vllm extra)"),
]


def first_paragraph(obj):
    doc = inspect.getdoc(obj) or ""
    para = doc.split("\n\n", 1)[0].strip()
    return " ".join(para.split())


def parameters(obj):
    """``[(name, type, description), ...]`` of the numpydoc ``Parameters``
    section of ``obj``'s docstring (empty without one)."""
    doc = inspect.getdoc(obj) or ""
    head = re.search(r"^Parameters\n-{3,}\n", doc, re.M)
    if head is None:
        return []
    out = []
    for line in doc[head.end():].splitlines():
        if not line.strip():
            continue
        if line.startswith(" "):  # the description of the last name
            if out:
                out[-1][2].append(line.strip())
            continue
        if re.fullmatch(r"-{3,}", line):  # the next section's underline: its title was no name
            out.pop()
            break
        name, colon, kind = line.partition(" : ")
        if not (colon or re.fullmatch(r"[*\w]+", line)):
            break  # prose after the section
        out.append((name.strip(), kind.strip(), []))
    return [(name, kind, " ".join(words)) for name, kind, words in out]


def parameter_lines(obj, indent):
    """The ``Parameters`` of ``obj`` as Markdown list items under ``indent``."""
    return [f"{indent}- `{name}`" + (f" ({kind})" if kind else "") + (f": {doc}" if doc else "")
            for name, kind, doc in parameters(obj)]


def _default(value):
    if isinstance(value, type):
        return f"{'np.' if value.__module__ == 'numpy' else ''}{value.__name__}"
    return repr(value)


def signature(obj):
    """The call signature without annotations (the docstrings say the
    types), defaults shown as written: ``(capacity=None, page_size=1, *, ...)``."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    parts, star = [], False
    for p in sig.parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        if p.kind is p.VAR_POSITIONAL:
            star = True
            parts.append(f"*{p.name}")
        elif p.kind is p.VAR_KEYWORD:
            parts.append(f"**{p.name}")
        elif p.default is p.empty:
            parts.append(p.name)
        else:
            parts.append(f"{p.name}={_default(p.default)}")
    return f"({', '.join(parts)})"


def public_names(module):
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, v in vars(module).items() if not n.startswith("_")
                 and getattr(v, "__module__", None) == module.__name__]
    return list(names)


def members(cls):
    out = []
    for name, value in cls.__dict__.items():
        if name.startswith("_") and name not in ("__len__", "__contains__", "__iter__"):
            continue
        if isinstance(value, property):
            out.append((name, "", first_paragraph(value), "property", value))
        elif isinstance(value, (staticmethod, classmethod)):
            func = value.__func__
            out.append((name, signature(func), first_paragraph(func), type(value).__name__,
                        func))
        elif inspect.isfunction(value):
            out.append((name, signature(value), first_paragraph(value), "method", value))
    return out


def class_members(cls):
    """Members of ``cls`` and of its bases defined in radix_soa (the shared
    tree base), each once, the class's own first."""
    seen, out = set(), []
    for klass in cls.__mro__:
        if not klass.__module__.startswith("radix_soa"):
            continue
        for m in members(klass):
            if m[0] not in seen:
                seen.add(m[0])
                out.append(m)
    return out


def render():
    lines = ["# API reference", "",
             "Generated from the docstrings by `python docs/make_api.py` (do not edit: "
             "`tests/test_docs_api.py` checks it is current). Each name links its signature "
             "and the first paragraph of its docstring, and lists its parameters when the "
             "docstring has a `Parameters` section; the docstrings hold the examples.", ""]
    for modname, what in MODULES:
        module = importlib.import_module(modname)
        lines += [f"## `{modname}`", "", f"{what[0].upper()}{what[1:]}.", ""]
        for name in public_names(module):
            obj = getattr(module, name)
            if inspect.ismodule(obj):
                lines.append(f"- `{name}`: the module `{obj.__name__}`; {first_paragraph(obj)}")
                continue
            if inspect.isclass(obj):
                lines += ["", f"### `{name}{signature(obj)}`", "", first_paragraph(obj), ""]
                if parameters(obj):
                    lines += ["Parameters:", ""] + parameter_lines(obj, "") + [""]
                for mname, sig, doc, kind, member in class_members(obj):
                    head = f"`{mname}`" if kind == "property" else f"`{mname}{sig}`"
                    tag = f" ({kind})" if kind in ("property", "classmethod", "staticmethod") else ""
                    lines.append(f"- {head}{tag}: {doc}" if doc else f"- {head}{tag}")
                    lines += parameter_lines(member, "  ")
                lines.append("")
            elif callable(obj):
                lines += [f"- `{name}{signature(obj)}`: {first_paragraph(obj)}"]
                lines += parameter_lines(obj, "  ")
            else:
                lines += [f"- `{name}`: {type(obj).__name__}"]
        lines.append("")
    text = "\n".join(lines)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text.rstrip() + "\n"


def main(argv):
    text = render()
    if "--check" in argv:
        if OUT.read_text() != text:
            print(f"{OUT} is out of date: run python docs/make_api.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
