"""The package by concept: a short __init__ of re-exports, one module per
concept, and torch imported by one module only (lazily), so that the rest
imports and runs without it."""
import ast
import pathlib
import subprocess
import sys

import npyload

PKG = pathlib.Path(npyload.__file__).parent
PUBLIC = {"Loader", "Batch", "BatchTuple", "Augment", "Transform", "TransformError",
          "FlipMismatchWarning", "NpyloadError",
          "inspect", "inspect_manifest", "load", "order_indices", "cuda_available", "build_info", "pack", "write",
          "prefetch", "cost_model", "dataset_facts", "copy_ceiling", "h2d_ceiling", "__version__"}


def test_public_names_are_exported():
    assert set(npyload.__all__) == PUBLIC
    for name in PUBLIC:
        assert hasattr(npyload, name), name


def test_init_only_re_exports():
    tree = ast.parse((PKG / "__init__.py").read_text())
    kinds = {type(n).__name__ for n in tree.body}
    assert kinds <= {"Expr", "ImportFrom", "Import", "Assign"}, kinds
    assert not any(isinstance(n, (ast.FunctionDef, ast.ClassDef)) for n in tree.body)


def test_only_the_torch_module_imports_torch():
    for path in PKG.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n == "torch" or n.startswith("torch.") for n in names):
                assert path.name == "_torch.py", f"{path.name} imports torch"


def test_import_and_a_batch_without_torch(tmp_path):
    """In a fresh interpreter, importing npyload and reading one batch on
    numpy leaves torch unimported."""
    import numpy as np
    np.save(tmp_path / "x_0000.npy", np.arange(24, dtype=np.float32).reshape(6, 4))
    code = (
        "import sys, npyload\n"
        "assert 'torch' not in sys.modules, 'import npyload imported torch'\n"
        f"L = npyload.Loader({{'x': {str(tmp_path / 'x_*.npy')!r}}}, batch_size=3, num_workers=1)\n"
        "b = next(iter(L))\n"
        "L.close()\n"
        "print('torch' in sys.modules)\n")
    # torch may be installed: block it so a lazy import would fail loudly
    # only where it is not guarded.
    out = subprocess.run([sys.executable, "-c", "import sys; sys.modules['torch'] = None\n" + code
                          .replace("assert 'torch' not in sys.modules", "assert sys.modules.get('torch') is None")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
