"""Find import cycles between the modules of a package (grimp's graph, the one import-linter
builds: imports inside functions and under ``TYPE_CHECKING`` count, since a reader and a
type checker follow them too).

``python scripts/import_cycles.py [PACKAGE]`` (run where PACKAGE is importable, as
``scripts/lint_imports.py`` does on the checkout) prints each cycle, one strongly
connected set of modules per line, and exits 1 when there is one.
"""

from __future__ import annotations

import sys

__all__ = ["find_cycles", "main"]


def find_cycles(package: str) -> list[list[str]]:
    """Each set of modules of ``package`` that import each other in a cycle (sorted)."""
    import grimp

    graph = grimp.build_graph(package, cache_dir=None)
    modules = sorted(graph.modules)
    inside = set(modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m) & inside) for m in modules}
    # Tarjan's strongly connected components, iterative (no recursion limit)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in modules:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            nexts = edges[node]
            if i < len(nexts):
                work.append((node, i + 1))
                nxt = nexts[i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    package = args[0] if args else "dse"
    cycles = find_cycles(package)
    for c in cycles:
        sys.stdout.write(f"import cycle: {' <-> '.join(c)}")
    sys.stdout.write(f"{len(cycles)} import cycle(s) between the modules of {package}\n")
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main())
