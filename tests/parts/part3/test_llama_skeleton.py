"""The Part 3 student files: provided files are the solution's, TODO files keep every
name and signature, and the skeleton still builds the tiny checkpoint."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ASSIGNMENT, ROOT, SOLUTION

PROVIDED = ["llama/__init__.py", "llama/tokenizer.py", "inference.py", "benchmark_inference.py"]
WITH_TODOS = ["llama/model.py", "llama/generation.py"]


@pytest.mark.parametrize("rel", PROVIDED)
def test_provided_files_are_the_solutions(rel: str) -> None:
    assert (ASSIGNMENT / rel).read_bytes() == (SOLUTION / rel).read_bytes()


def signatures(path: Path) -> dict[str, str]:
    """Every top-level function, class and method with its argument list."""
    tree = ast.parse(path.read_text())
    found: dict[str, str] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found[prefix + node.name] = ast.unparse(node.args)
            elif isinstance(node, ast.ClassDef):
                found[prefix + node.name] = ", ".join(ast.unparse(b) for b in node.bases)
                visit(node.body, f"{prefix}{node.name}.")

    visit(tree.body, "")
    return found


@pytest.mark.parametrize("rel", WITH_TODOS)
def test_todo_files_keep_every_name_and_signature(rel: str) -> None:
    assert signatures(ASSIGNMENT / rel) == signatures(SOLUTION / rel)
    assert "NotImplementedError" in (ASSIGNMENT / rel).read_text()
    # The solution holds the skeleton's raise only in comments (its prompts), never as code.
    names = {
        n.id for n in ast.walk(ast.parse((SOLUTION / rel).read_text())) if isinstance(n, ast.Name)
    }
    assert "NotImplementedError" not in names


def test_skeleton_todos_cover_the_cache_and_the_decode_loop() -> None:
    model = (ASSIGNMENT / "llama/model.py").read_text()
    generation = (ASSIGNMENT / "llama/generation.py").read_text()
    assert "self.cache_k[:bsz, start_pos : start_pos + seqlen]" not in model
    code = [ln for ln in generation.splitlines() if not ln.strip().startswith("#")]
    assert not any(ln.strip() == "prev_pos = cur_pos" for ln in code)
    assert "torch.multinomial(probs_sort" not in generation


def test_skeleton_builds_the_tiny_checkpoint(tmp_path: Path) -> None:
    import subprocess
    import sys

    ckpt = ROOT / "test_cases" / "public" / "part3" / "tiny_llama"
    code = (
        "from llama.model import Llama\n"
        f"m, t = Llama.build({str(ckpt)!r}, {str(ckpt / 'tokenizer.model')!r}, 64, 2)\n"
        "print(sum(p.numel() for p in m.parameters()))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ASSIGNMENT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.split()[-1]) > 100_000
