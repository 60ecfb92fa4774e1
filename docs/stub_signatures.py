# SPDX-License-Identifier: Apache-2.0
"""Sphinx extension: the API reference takes its signatures from the type stubs.

autodoc reads signatures off the objects, and there they are poor: Cython's
embedded signatures name ``self`` and C types, the op functions are made at
import time without annotations, and compiled properties carry no type. The
stubs (a ``.pyi`` beside each compiled module, ``tensorplay/__init__.pyi``
and ``tensorplay/_tensor/tensor.pyi`` generated from the op tables, inline
annotations in the pure-Python modules) are what type checkers see, and
``stubtest`` checks them against the runtime (tests/api/test_typing.py), so
the reference shows them:

- functions, methods and constructors: the stub's parameters with their
  types and defaults, without ``self``, and the return type; overloads as
  several signatures;
- attributes and properties: the stub's type after the name.

An object is looked up by its documented name (``tensorplay.Tensor.sum``:
``tensorplay/__init__.pyi`` re-exports ``Tensor`` from
``tensorplay/_tensor/tensor.pyi``), following ``from ... import`` and base
classes through the stubs. Type names are qualified (``DTypeLike`` ->
``tensorplay.types.DTypeLike``) so that they link; with
``python_use_unqualified_type_names`` they display short. When
``stub_signatures_strict`` is on, a documented callable without a stub
declaration is a warning (an error under ``-W``).
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib.util
import os
import re
import sys

from docutils import nodes
from sphinx import addnodes
from sphinx.util import logging

logger = logging.getLogger(__name__)

# Names used in the stubs' annotations -> what they document as.
QUALIFY = {
    "Tensor": "tensorplay.Tensor",
    "dtype": "tensorplay.dtype",
    "device": "tensorplay.device",
    "Stream": "tensorplay.cuda.Stream",
    "ExternalStream": "tensorplay.cuda.ExternalStream",
    "Event": "tensorplay.cuda.Event",
    "CUDAGraph": "tensorplay.cuda.CUDAGraph",
    "CUDAGraphified": "tensorplay._stax.cudagraphs.CUDAGraphified",
    "CudaError": "tensorplay.cuda.CudaError",
    "Generator": "tensorplay.Generator",
    "np": "numpy",
    "npt": "numpy.typing",
    "return_types": "tensorplay.return_types",
}


def _types_names():
    import tensorplay.types
    return {n: f"tensorplay.types.{n}" for n in tensorplay.types.__all__}


# ------------------------------------------------------------------ reading the stubs

@functools.cache
def _module_ast(modname):
    """(AST, is_package) of ``modname``'s stub: its .pyi, else its .py source."""
    try:
        spec = importlib.util.find_spec(modname)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    folder = os.path.dirname(spec.origin)
    is_package = spec.submodule_search_locations is not None
    stem = "__init__" if is_package else os.path.basename(spec.origin).split(".")[0]
    for path in (os.path.join(folder, stem + ".pyi"), os.path.join(folder, stem + ".py")):
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            tree.is_stub = path.endswith(".pyi")
            return tree, is_package
    return None


def _is_module(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _import_target(modname, is_package, node):
    """The absolute module name of ``from <node.module> import ...`` inside ``modname``."""
    if not node.level:
        return node.module
    parts = modname.split(".")
    if not is_package:
        parts = parts[:-1]
    if node.level > 1:
        parts = parts[:len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def _bindings(body, name):
    """The statements of ``body`` binding ``name`` (every def, for overloads)."""
    found = []
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            found.append(node)
        elif isinstance(node, ast.ClassDef) and node.name == name:
            found = [node]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            found = [node]
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    found = [(node, alias)]
        elif isinstance(node, ast.If):            # if TYPE_CHECKING: ...
            inner = _bindings(node.body, name) or _bindings(node.orelse, name)
            if inner:
                found = inner
    return found


def _resolve(modname, path, depth=0):
    """(module, bindings, enclosing ClassDef or None) of ``path`` in ``modname``'s stub."""
    got = _module_ast(modname)
    if got is None or depth > 20:
        return None
    tree, is_package = got
    body, owner = tree.body, None
    for i, name in enumerate(path):
        found = _bindings(body, name)
        if not found and owner is not None:
            return _from_bases(modname, owner, path[i:], depth)
        if not found:
            return None
        first = found[0]
        rest = path[i + 1:]
        if isinstance(first, tuple):                 # an import: continue where it points
            node, alias = first
            target = _import_target(modname, is_package, node)
            if _is_module(f"{target}.{alias.name}"):
                return _resolve(f"{target}.{alias.name}", rest, depth + 1) if rest else None
            return _resolve(target, [alias.name] + rest, depth + 1)
        if not rest:
            return modname, found, owner
        if not isinstance(first, ast.ClassDef):
            return None
        body, owner = first.body, first
    return None


def _from_bases(modname, cls, path, depth):
    for base in cls.bases:
        if isinstance(base, ast.Name):
            hit = _resolve(modname, [base.id] + path, depth + 1)
            if hit is not None:
                return hit
    return None


def _split(fullname):
    """``tensorplay.cuda.Stream.query`` -> ("tensorplay.cuda", ["Stream", "query"])."""
    parts = fullname.split(".")
    for n in range(len(parts) - 1, 0, -1):
        mod = ".".join(parts[:n])
        if mod in sys.modules or _is_module(mod):
            return mod, parts[n:]
    return None, parts


# ------------------------------------------------------------------ formatting

class _Qualify(ast.NodeTransformer):
    def __init__(self, names):
        self.names = names

    def visit_Attribute(self, node):
        if isinstance(node.value, ast.Name) and node.value.id == "builtins":
            return ast.copy_location(ast.Name(id=node.attr), node)
        self.generic_visit(node)
        return node

    def visit_Name(self, node):
        if node.id in self.names:
            return ast.copy_location(ast.Name(id=self.names[node.id]), node)
        return node

    def visit_Constant(self, node):                  # "CUDAGraph" forward references
        if isinstance(node.value, str) and node.value in self.names:
            return ast.copy_location(ast.Name(id=self.names[node.value]), node)
        return node


def _annotation(expr, names):
    return ast.unparse(_Qualify(names).visit(copy.deepcopy(expr)))


def _decorators(fn):
    return {ast.unparse(d) for d in fn.decorator_list}


def _format(fn, drop_first, names):
    """(args, return annotation) of a stub def."""
    args = copy.deepcopy(fn.args)
    if drop_first:
        if args.posonlyargs:
            args.posonlyargs = args.posonlyargs[1:]
        elif args.args:
            args.args = args.args[1:]
    for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
        if a is not None and a.annotation is not None:
            a.annotation = _Qualify(names).visit(a.annotation)
    ret = _annotation(fn.returns, names) if fn.returns is not None else ""
    return f"({ast.unparse(args)})", ret


def _lookup(fullname):
    """(path inside its module, _resolve's hit) for a documented name; hit
    None when the stubs do not declare it."""
    modname, path = _split(fullname)
    if modname is None or not path:
        return path, None
    return path, _resolve(modname, path)


def _signatures(what, fullname, names):
    """[(args, retann)] from the stubs, or None when the stub has no declaration."""
    path, hit = _lookup(fullname)
    if hit is None:
        return None
    _mod, found, owner = hit
    if what in ("class", "exception"):
        cls = found[0]
        if not isinstance(cls, ast.ClassDef):
            return None
        for ctor in ("__init__", "__new__"):
            ctor_hit = _resolve(_mod, path[-1:] + [ctor]) if _mod else None
            if ctor_hit is not None:
                defs = [d for d in ctor_hit[1] if isinstance(d, ast.FunctionDef) and _annotated(d)]
                if defs:
                    return [(_format(d, True, names)[0], "") for d in _pick_overloads(defs)]
        # no constructor declared anywhere: a Protocol or a stub-only class
        # shows none; a Python class keeps what autodoc reads off it
        tree = _module_ast(_mod)[0]
        if any(ast.unparse(b).split(".")[-1].startswith("Protocol") for b in cls.bases) or tree.is_stub:
            return []
        return None
    defs = [d for d in found if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if not defs or not any(_annotated(d) for d in defs):
        return None                    # no type information there
    defs = _pick_overloads(defs)
    drop = owner is not None and "staticmethod" not in _decorators(defs[0])
    return [_format(d, drop, names) for d in defs]


def _annotated(fn):
    a = fn.args
    return fn.returns is not None or any(
        x is not None and x.annotation is not None
        for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg])


def _pick_overloads(defs):
    """The @overload variants when there are some (a .py also has the implementation)."""
    over = [d for d in defs if "overload" in _decorators(d) or "typing.overload" in _decorators(d)]
    return over or defs[-1:]


def _attribute_type(fullname, names):
    _, hit = _lookup(fullname)
    if hit is None:
        return None
    node = hit[1][0]
    if isinstance(node, ast.AnnAssign):
        return _annotation(node.annotation, names)
    if isinstance(node, ast.FunctionDef) and node.returns is not None and "property" in _decorators(node):
        return _annotation(node.returns, names)
    return None


# ------------------------------------------------------------------ Sphinx hooks

def _names():
    names = dict(QUALIFY)
    names.update(_types_names())
    return names


def process_signature(app, what, name, obj, options, signature, return_annotation):
    if what not in ("function", "method", "class", "exception", "decorator"):
        return None
    sigs = _signatures(what, name, _names())
    if sigs is None:
        if app.config.stub_signatures_strict and what in ("function", "method") and \
                name.split(".")[-1][:1] != "_":
            logger.warning("stub_signatures: no stub declares %s", name, type="stub_signatures")
        return None
    if signature is None:
        return None                    # autodoc has no signature to replace
    if not sigs:
        # no constructor in the stubs: keep a plain "()", hide autodoc's
        # "(*args, **kwargs)" of the run-time type (Tensor() raises)
        return None if signature == "()" else ("", None)
    # several signatures (overloads) are lines of one directive; each repeats
    # the dotted name the directive gives the first (Tensor.size, not size)
    _mod, path = _split(name)
    dotted = ".".join(path)
    if what in ("class", "exception"):
        return f"\n{dotted}".join(args for args, _ in sigs), None
    lines = [f"{args} -> {ret}" if ret else args for args, ret in sigs[:-1]]
    last_args, last_ret = sigs[-1]
    return f"\n{dotted}".join(lines + [last_args]), last_ret or None


_IDENT = re.compile(r"[A-Za-z_][\w.]*")


def _type_nodes(text):
    """Nodes of a type expression: dotted names become cross-references."""
    out = []
    pos = 0
    for m in _IDENT.finditer(text):
        if m.start() > pos:
            out.append(addnodes.desc_sig_punctuation("", text[pos:m.start()]))
        target = m.group()
        short = target.rsplit(".", 1)[-1]
        if target in ("None", "True", "False"):
            out.append(addnodes.desc_sig_keyword("", target))
        else:
            ref = addnodes.pending_xref("", nodes.Text(short), refdomain="py", reftype="class",
                                        reftarget=target)
            out.append(ref)
        pos = m.end()
    if pos < len(text):
        out.append(addnodes.desc_sig_punctuation("", text[pos:]))
    return out


def add_attribute_types(app, domain, objtype, contentnode):
    """Give py:attribute and py:property entries without a type the stub's type."""
    if domain != "py" or objtype not in ("attribute", "property"):
        return
    desc = contentnode.parent
    names = _names()
    for sig in desc.children:
        if not isinstance(sig, addnodes.desc_signature):
            continue
        if any(isinstance(n, addnodes.desc_annotation) and ":" in n.astext() for n in sig.children):
            continue
        fullname = ".".join(p for p in (sig.get("module"), sig.get("fullname")) if p)
        typ = _attribute_type(fullname, names)
        if typ:
            sig += addnodes.desc_annotation(typ, "", addnodes.desc_sig_punctuation("", ":"),
                                            addnodes.desc_sig_space(), *_type_nodes(typ))


def setup(app):
    app.add_config_value("stub_signatures_strict", False, "env")
    app.connect("autodoc-process-signature", process_signature)
    app.connect("object-description-transform", add_attribute_types)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
