"""Prints the counts of the package's shape that issue 45 tracks, for a checkout.

The counts: docstring share, lines over 100 columns, modules taking the whole config, and casts of
config values in the phases' packages.

    python scripts/code_counts.py [path/to/checkout]
"""

import ast
import sys
from pathlib import Path


def docstring_lines(tree: ast.AST) -> int:
    n = 0
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    n += body[0].end_lineno - body[0].lineno + 1
    return n


def main(root: Path) -> None:
    sys.path.insert(0, str(root))
    from tests.test_config_sections import offences

    package = root / "vapo_lab"
    files = sorted(p for p in package.rglob("*.py") if "shipped" not in p.parts)
    total = doc = long = 0
    whole = []
    casts = 0
    for path in files:
        text = path.read_text()
        lines = text.splitlines()
        total += len(lines)
        long += sum(len(line) > 100 for line in lines)
        doc += docstring_lines(ast.parse(text))
        if "DictConfig" in text:
            whole.append(str(path.relative_to(package)))
        if path.relative_to(package).parts[0] in ("trainer", "rollout", "eval"):
            casts += len(offences(text))
    print(
        f"lines {total}, docstring lines {doc} ({100 * doc / total:.1f}%), over 100 columns {long}"
    )
    print(f"modules naming DictConfig: {len(whole)}: {', '.join(whole)}")
    print(f"casts and re-stated defaults of config values in trainer/, rollout/, eval/: {casts}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve())
